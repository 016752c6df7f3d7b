"""Sandboxed Jinja chat-template rendering with transformers' ``apply_chat_template`` semantics."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, NoReturn

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

from smg_trio import jsontext
from smg_trio.errors import ValidationError

__all__ = [
    "CONTENT_FORMATS",
    "RESERVED_TEMPLATE_VARS",
    "ChatTemplate",
    "normalize_messages",
    "request_template",
]

#: Template variables the renderer sets itself; ``chat_template_kwargs`` may not override them.
RESERVED_TEMPLATE_VARS = frozenset(
    {"messages", "tools", "documents", "add_generation_prompt", "continue_final_message"}
)


def _is_list(obj: object) -> bool:
    return isinstance(obj, Sequence) and not isinstance(obj, (str, bytes))


def _raise_exception(message: str) -> NoReturn:
    raise jinja2.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # transformers' override: no HTML escaping, non-ASCII kept, indent/separators exposed.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` (transformers' assistant mask): body as-is."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> list[jinja2.nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _make_env() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols, _GenerationTag],
        autoescape=False,
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


_ENV = _make_env()


#: ``--chat-template-content-format`` values (vLLM's): how message content reaches templates.
CONTENT_FORMATS = ("auto", "string", "openai")


def _content_parts(content: Any, where: str) -> list[dict[str, str]] | None:
    """vLLM's ``openai`` content format: a list of ``{"type": "text", "text": ...}`` parts (a
    string content becomes one part); ``None`` kept."""
    if content is None:
        return None
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    _content_text(content, where)  # the same checks and 400s as the string format
    return [{"type": "text", "text": part["text"]} for part in content]


def _iterates_content(source: str) -> bool:
    """Whether a template loops over a message's ``content`` (``{% for c in
    message['content'] %}``): vLLM's ``auto`` detection picks the ``openai`` format then."""
    try:
        ast = _ENV.parse(source)
    except jinja2.TemplateSyntaxError:
        return False
    for loop in ast.find_all(jinja2.nodes.For):
        it = loop.iter
        if isinstance(it, jinja2.nodes.Filter) and it.node is not None:
            it = it.node
        if isinstance(it, jinja2.nodes.Getattr) and it.attr == "content":
            return True
        if (
            isinstance(it, jinja2.nodes.Getitem)
            and isinstance(it.arg, jinja2.nodes.Const)
            and it.arg.value == "content"
        ):
            return True
    return False


def _content_text(content: Any, where: str) -> str | None:
    """A message's content as a string: text parts joined with ``"\\n"``; ``None`` kept."""
    if content is None or isinstance(content, str):
        return content
    if not _is_list(content):
        raise ValidationError(
            f"{where}.content must be a string or a list of content parts",
            param=f"{where}.content",
        )
    texts: list[str] = []
    for j, part in enumerate(content):
        part_where = f"{where}.content[{j}]"
        if not isinstance(part, Mapping):
            raise ValidationError(f"{part_where} must be an object", param=part_where)
        kind = part.get("type")
        if kind != "text":
            raise ValidationError(
                f"{part_where}.type {kind!r} is not supported; only 'text' content parts are",
                param=f"{part_where}.type",
            )
        text = part.get("text")
        if not isinstance(text, str):
            raise ValidationError(f"{part_where}.text must be a string", param=f"{part_where}.text")
        texts.append(text)
    return "\n".join(texts)


def _parse_tool_calls(tool_calls: Any, where: str) -> Any:
    """Copy ``tool_calls`` with JSON-string ``function.arguments`` parsed, as templates expect."""
    if not _is_list(tool_calls):
        return tool_calls
    out: list[Any] = []
    for j, call in enumerate(tool_calls):
        fn = call.get("function") if isinstance(call, Mapping) else None
        args = fn.get("arguments") if isinstance(fn, Mapping) else None
        if isinstance(call, Mapping) and isinstance(fn, Mapping) and isinstance(args, str):
            param = f"{where}.tool_calls[{j}].function.arguments"
            parsed = jsontext.loads(args, param=param)
            call = {**call, "function": {**fn, "arguments": parsed}}
        out.append(call)
    return out


def _reasoning_both_names(msg: dict[str, Any], where: str) -> None:
    """An assistant turn's reasoning under both names, as vLLM 0.32 hands it to templates:
    ``reasoning`` wins, the deprecated ``reasoning_content`` fills in when it is absent."""
    reasoning = msg.get("reasoning")
    if reasoning is None:
        reasoning = msg.get("reasoning_content")
    if reasoning is None:
        msg.pop("reasoning", None)
        msg.pop("reasoning_content", None)
        return
    if not isinstance(reasoning, str):
        name = "reasoning" if msg.get("reasoning") is not None else "reasoning_content"
        raise ValidationError(f"{where}.{name} must be a string", param=f"{where}.{name}")
    msg["reasoning"] = msg["reasoning_content"] = reasoning


def normalize_messages(
    messages: Sequence[Mapping[str, Any]],
    *,
    developer_as_system: bool = False,
    content_format: str = "string",
) -> list[dict[str, Any]]:
    """Copy OpenAI chat messages into the shape chat templates expect.

    Each message must be a mapping with a string ``role``. A ``content`` list of
    ``{"type": "text", "text": ...}`` parts becomes one string (parts joined with ``"\\n"``);
    assistant ``tool_calls[].function.arguments`` JSON strings become parsed values, and a
    ``null`` content of an assistant turn that calls tools becomes ``""``, so templates
    that concatenate strings render it; an assistant turn's ``reasoning`` (or the
    deprecated ``reasoning_content``) is passed under both names, as vLLM 0.32 does. With ``developer_as_system`` a ``developer`` message
    becomes a ``system`` one (for templates that know only ``system``). The input is not
    mutated. With ``content_format="openai"`` (vLLM's) every content stays a list of text
    parts instead (a string becomes one part). Raises ``ValidationError`` naming the offending
    field (e.g.
    ``messages[1].content[0].type``) for any other shape.
    """
    if not _is_list(messages):
        raise ValidationError("messages must be a list of message objects", param="messages")
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise ValidationError(f"{where} must be an object", param=where)
        if not isinstance(message.get("role"), str):
            raise ValidationError(f"{where}.role must be a string", param=f"{where}.role")
        msg = dict(message)
        if developer_as_system and msg["role"] == "developer":
            msg["role"] = "system"
        if "content" in msg:
            if content_format == "openai":
                msg["content"] = _content_parts(msg["content"], where)
            else:
                msg["content"] = _content_text(msg["content"], where)
        if msg.get("content") is None and msg.get("tool_calls"):
            msg["content"] = ""
        if msg.get("tool_calls") is not None:
            msg["tool_calls"] = _parse_tool_calls(msg["tool_calls"], where)
        if msg["role"] == "assistant":
            _reasoning_both_names(msg, where)
        out.append(msg)
    return out


def _truncate_to_final_message(rendered: str, final: str) -> str:
    """transformers' ``continue_final_message``: cut the prompt right after the last message."""
    stripped = final.strip()
    loc = rendered.rfind(stripped)
    if not stripped or loc < 0:
        raise ValidationError(
            "continue_final_message is set but the final message does not appear in the "
            "rendered chat template",
            param="continue_final_message",
        )
    lstripped = final.lstrip()
    if rendered[loc : loc + len(lstripped)] == lstripped:
        return rendered[: loc + len(lstripped)]
    return rendered[: loc + len(stripped)]


class ChatTemplate:
    """One compiled chat template (Jinja source from ``tokenizer_config.json``).

    Compiled once in a sandboxed environment (``ImmutableSandboxedEnvironment`` with
    ``trim_blocks``, ``lstrip_blocks``, ``loopcontrols``, ``raise_exception``,
    ``strftime_now`` and transformers' ``tojson``). Raises ``ValueError`` on a syntax error.
    """

    __slots__ = ("_template", "content_format", "name", "source")

    def __init__(self, source: str, *, name: str = "default", content_format: str = "auto") -> None:
        if not isinstance(source, str):
            raise ValueError(f"chat template {name!r} must be a string")
        if content_format not in CONTENT_FORMATS:
            raise ValueError(
                f"chat template content format must be one of {', '.join(CONTENT_FORMATS)}, "
                f"got {content_format!r}"
            )
        self.name = name
        self.source = source
        #: ``string`` or ``openai``: ``auto`` resolved as vLLM does, from the template itself.
        self.content_format = (
            ("openai" if _iterates_content(source) else "string")
            if content_format == "auto"
            else content_format
        )
        try:
            self._template = _ENV.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ValueError(
                f"chat template {name!r} does not compile: {exc.message} (line {exc.lineno})"
            ) from exc

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = False,
        continue_final_message: bool = False,
        special_tokens: Mapping[str, Any] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """Render ``messages`` to the prompt string (not tokenized).

        Variables: ``messages`` (normalized by :func:`normalize_messages`), ``tools``,
        ``documents``, ``add_generation_prompt``, the ``special_tokens`` (``bos_token``,
        ``eos_token``, ...) and then ``chat_template_kwargs`` (e.g. ``enable_thinking``),
        which may override special tokens but not :data:`RESERVED_TEMPLATE_VARS`. With
        ``continue_final_message`` the prompt ends right after the final message's text so
        the model continues it. Raises ``ValidationError`` (400) for bad messages or
        arguments and for any template failure, including ``raise_exception``.
        """
        if add_generation_prompt and continue_final_message:
            raise ValidationError(
                "continue_final_message and add_generation_prompt are mutually exclusive",
                param="continue_final_message",
            )
        msgs = normalize_messages(
            messages,
            developer_as_system="developer" not in self.source,
            content_format=self.content_format,
        )
        if tools is not None and not _is_list(tools):
            raise ValidationError("tools must be a list of tool objects", param="tools")
        context: dict[str, Any] = dict(special_tokens or {})
        if chat_template_kwargs:
            if not isinstance(chat_template_kwargs, Mapping):
                raise ValidationError(
                    "chat_template_kwargs must be an object", param="chat_template_kwargs"
                )
            reserved = sorted(RESERVED_TEMPLATE_VARS.intersection(chat_template_kwargs))
            if reserved:
                raise ValidationError(
                    f"chat_template_kwargs may not set {', '.join(reserved)}; "
                    "use the request's own fields",
                    param="chat_template_kwargs",
                )
            context.update(chat_template_kwargs)
        context.update(
            messages=msgs,
            tools=list(tools) if tools else None,
            documents=list(documents) if documents else None,
            add_generation_prompt=add_generation_prompt,
        )
        try:
            rendered = self._template.render(context)
        except jinja2.TemplateError as exc:
            raise ValidationError(
                f"chat template error: {exc.message or type(exc).__name__}", param="messages"
            ) from exc
        except Exception as exc:  # a template is arbitrary code; any failure is the input's
            raise ValidationError(
                f"chat template rendering failed: {type(exc).__name__}: {exc}", param="messages"
            ) from exc
        if continue_final_message:
            final = msgs[-1].get("content") if msgs else None
            if isinstance(final, list):  # the openai format: its text parts
                final = "\n".join(part["text"] for part in final)
            if not isinstance(final, str):
                raise ValidationError(
                    "continue_final_message needs a final message with text content",
                    param="continue_final_message",
                )
            rendered = _truncate_to_final_message(rendered, final)
        return rendered


@functools.lru_cache(maxsize=32)
def request_template(source: str, content_format: str = "auto") -> ChatTemplate:
    """A request's own ``chat_template`` compiled in the same sandbox (the last 32 kept, so a
    client that repeats one pays its compile once). Raises ``ValidationError`` (400, param
    ``chat_template``) when it does not compile."""
    try:
        return ChatTemplate(source, name="request", content_format=content_format)
    except ValueError as exc:
        raise ValidationError(str(exc), param="chat_template") from None
