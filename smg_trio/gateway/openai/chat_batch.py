"""vLLM 0.32's ``POST /v1/chat/completions/batch``: several conversations, one choice each."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import msgspec

from smg_trio.backend import ServedModel
from smg_trio.errors import ValidationError
from smg_trio.gateway.config import GatewayHttpConfig
from smg_trio.gateway.openai.api import ResponseIds
from smg_trio.gateway.openai.chat import CHAT, ChatDraft, ChatJob
from smg_trio.gateway.openai.fanout import SubRequest, usage_of
from smg_trio.gateway.openai.framing import StreamRenderer
from smg_trio.gateway.openai.schemas import ChatCompletion, ChatCompletionRequest
from smg_trio.gateway.openai.textgen import ChoiceCollector

__all__ = ["CHAT_BATCH", "BatchChatCompletionRequest", "ChatBatchApi"]


class BatchChatCompletionRequest(ChatCompletionRequest, kw_only=True):
    """The chat request's fields, with ``messages`` a list of conversations (vLLM's
    ``BatchChatCompletionRequest``)."""

    messages: list[list[dict[str, Any]]]  # type: ignore[assignment]


def _bad(message: str, param: str) -> ValidationError:
    return ValidationError(message, param=param, code="unsupported_field")


class ChatBatchApi:
    """``POST /v1/chat/completions/batch``: each conversation is planned as its own chat
    request (choice ``index`` = the conversation's), answered together in one
    ``chat.completion`` with the usage summed. As vLLM 0.32: no streaming, no tools, ``n``
    1, no beam search (each a 400 naming the field)."""

    name = "chat_batch"
    id_prefix = "chatcmpl-"
    body_type = BatchChatCompletionRequest

    def check(
        self, body: BatchChatCompletionRequest, served: ServedModel, config: GatewayHttpConfig
    ) -> ChatBatchDraft:
        if body.stream:
            raise _bad("batch chat completions do not support streaming", "stream")
        if body.tools:
            raise _bad("batch chat completions do not support tools", "tools")
        if body.n not in (None, 1):
            raise _bad("batch chat completions take n = 1 (one choice per conversation)", "n")
        if body.use_beam_search:
            raise _bad("Batch chat completions do not support beam search.", "use_beam_search")
        if not body.messages:
            raise ValidationError("messages must hold at least one conversation", param="messages")
        if len(body.messages) > config.max_prompts:
            raise ValidationError(
                f"a batch may hold at most {config.max_prompts} conversations, "
                f"got {len(body.messages)}",
                param="messages",
            )
        drafts = []
        for i, conversation in enumerate(body.messages):
            one: ChatCompletionRequest = msgspec.structs.replace(body, messages=conversation)
            try:
                drafts.append(CHAT.check(one, served, config))
            except ValidationError as exc:
                param = exc.param or ""
                if param.startswith("messages"):  # messages[j]... -> messages[i][j]...
                    exc.param = f"messages[{i}]{param.removeprefix('messages')}"
                raise
        return ChatBatchDraft(drafts)


@attrs.frozen
class ChatBatchDraft:
    drafts: list[ChatDraft]

    def tokenize(self) -> list[tuple[str, list[int]]]:
        return [d.tokenize() for d in self.drafts]

    def build(self, tokens: list[tuple[str, list[int]]], ids: ResponseIds) -> ChatBatchJob:
        jobs = [
            d.build(t, ids, first_index=i)
            for i, (d, t) in enumerate(zip(self.drafts, tokens, strict=True))
        ]
        return ChatBatchJob(jobs)


@attrs.frozen
class ChatBatchJob:
    """The conversations' jobs, run as one request's sub-requests."""

    jobs: list[ChatJob]
    stream: bool = False
    answered: bool = False

    @property
    def subs(self) -> Sequence[SubRequest]:
        return [s for job in self.jobs for s in job.subs]

    @property
    def prompt_tokens(self) -> int:
        return sum(job.prompt_tokens for job in self.jobs)

    @property
    def data_parallel_rank(self) -> int | None:
        return self.jobs[0].data_parallel_rank

    def renderer(self) -> StreamRenderer:
        raise AssertionError("batch chat completions are never streamed (checked first)")

    def result(self, collected: ChoiceCollector | None) -> ChatCompletion:
        """One ``chat.completion``: each conversation's choice at its index, usage summed."""
        assert collected is not None
        first = self.jobs[0].result(collected)
        for job in self.jobs[1:]:
            first.choices.extend(job.result(collected).choices)
        first.usage = usage_of(self.prompt_tokens, self.subs)
        first.prompt_logprobs = None
        first.prompt_token_ids = None
        return first


#: vLLM's batch chat completions API.
CHAT_BATCH = ChatBatchApi()
