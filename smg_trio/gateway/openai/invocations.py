"""SageMaker's ``POST /invocations``: a chat or a completions body, told apart as vLLM does."""

from __future__ import annotations

from typing import Any, cast

import attrs
import msgspec

from smg_trio.backend import ServedModel
from smg_trio.gateway.config import GatewayHttpConfig
from smg_trio.gateway.openai.api import Draft, Job, ResponseIds
from smg_trio.gateway.openai.chat import CHAT
from smg_trio.gateway.openai.completions import COMPLETIONS
from smg_trio.gateway.openai.errors import ApiError
from smg_trio.gateway.openai.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    SamplingRequest,
    convert_body,
)

__all__ = ["INVOCATIONS", "InvocationRequest", "InvocationsApi"]


def _names(type_: type[msgspec.Struct]) -> set[str]:
    return {f.name for f in msgspec.structs.fields(type_)}


#: Every field of a chat or a completions body: the shared ones typed (checked on decode),
#: the others kept as sent and checked when the body is converted to its API's type.
InvocationRequest = cast(
    type[SamplingRequest],
    msgspec.defstruct(
        "InvocationRequest",
        [
            (name, Any, None)
            for name in sorted(
                (_names(ChatCompletionRequest) | _names(CompletionRequest))
                - _names(SamplingRequest)
            )
        ],
        bases=(SamplingRequest,),
        kw_only=True,
    ),
)


@attrs.frozen
class _Prefixed:
    """The chosen API's draft, its response id under that API's prefix (``chatcmpl-``,
    ``cmpl-``), as its own route would name it."""

    draft: Draft[Any]
    prefix: str

    def tokenize(self) -> Any:
        return self.draft.tokenize()

    def build(self, tokens: Any, ids: ResponseIds) -> Job:
        if not ids.response_id.startswith(self.prefix):
            ids = attrs.evolve(ids, response_id=self.prefix + ids.response_id)
        return self.draft.build(tokens, ids)


class InvocationsApi:
    """``POST /invocations`` (vLLM's SageMaker route): a body with ``messages`` is a chat
    completion, else one with ``prompt`` is a completion (vLLM tries the chat schema first,
    then the completions one); a body with neither is a 400 naming both."""

    name = "invocations"
    id_prefix = ""
    body_type = InvocationRequest

    def check(
        self, body: SamplingRequest, served: ServedModel, config: GatewayHttpConfig
    ) -> Draft[Any]:
        fields = {k: v for k, v in msgspec.to_builtins(body).items() if v is not None}
        if "messages" in fields:
            chat = convert_body(fields, ChatCompletionRequest)
            return _Prefixed(CHAT.check(chat, served, config), CHAT.id_prefix)
        if "prompt" in fields:
            completion = convert_body(fields, CompletionRequest)
            return _Prefixed(COMPLETIONS.check(completion, served, config), COMPLETIONS.id_prefix)
        raise ApiError(
            400,
            "Cannot find suitable handler for request. Expected one of: "
            "['ChatCompletionRequest', 'CompletionRequest'] (a body with 'messages' or 'prompt')",
            param="messages",
            code="missing_required_parameter",
        )


INVOCATIONS = InvocationsApi()
