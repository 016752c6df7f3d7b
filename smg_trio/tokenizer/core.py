"""The ``Tokenizer`` wrapper: HF ``tokenizers`` plus ``tokenizer_config.json`` from a model dir."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from smg_trio.errors import ValidationError
from smg_trio.tokenizer.bound import max_token_chars, min_tokens
from smg_trio.tokenizer.chat_template import ChatTemplate
from smg_trio.tokenizer.modeldir import ModelDir
from smg_trio.tokenizer.prefix import prefix_bound_ok, prefix_min_tokens

__all__ = ["SPECIAL_TOKEN_KEYS", "Tokenizer", "load_json", "load_model_json"]

#: ``tokenizer_config.json`` keys naming one special token each.
SPECIAL_TOKEN_KEYS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


def load_json(path: Path) -> dict[str, Any]:
    """Read a JSON object file. Missing file: ``{}``. Raises ``ValueError`` if it is not a
    JSON object."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    return _json_object(text, str(path))


def load_model_json(model_dir: ModelDir, name: str) -> dict[str, Any]:
    """``load_json`` of the file ``name`` of a (possibly confined) model directory."""
    text = model_dir.read_text(name)
    return {} if text is None else _json_object(text, str(model_dir.path / name))


def _json_object(text: str, where: str) -> dict[str, Any]:
    try:
        obj = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{where}: invalid JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object")
    return obj


def _token_content(value: Any) -> str | None:
    """A special token given as a string or an ``AddedToken`` dict (``{"content": ...}``)."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _parse_templates(raw: Any) -> dict[str, str]:
    """``chat_template`` as a string or a list of ``{"name", "template"}`` -> name -> source."""
    if raw is None:
        return {}
    if isinstance(raw, str):
        return {"default": raw}
    if isinstance(raw, Mapping):
        return {str(k): v for k, v in raw.items() if isinstance(v, str)}
    if isinstance(raw, list):
        out: dict[str, str] = {}
        for item in raw:
            if not (isinstance(item, Mapping) and isinstance(item.get("template"), str)):
                raise ValueError("chat_template list entries must be {name, template} objects")
            out[str(item.get("name", "default"))] = item["template"]
        return out
    raise ValueError(f"chat_template must be a string or a list, got {type(raw).__name__}")


def _load_templates(model_dir: ModelDir, config: Mapping[str, Any]) -> dict[str, str]:
    """Templates from ``tokenizer_config.json``, overridden by ``chat_template.jinja`` /
    ``chat_template.json`` when present (newer transformers save them there)."""
    templates = _parse_templates(config.get("chat_template"))
    jinja = model_dir.read_text("chat_template.jinja")
    if jinja is not None:
        templates["default"] = jinja
    elif model_dir.file("chat_template.json") is not None:
        raw = load_model_json(model_dir, "chat_template.json").get("chat_template")
        templates.update(_parse_templates(raw))
    return templates


def _gives_token_types(config: Mapping[str, Any]) -> bool:
    """Whether transformers' tokenizer returns ``token_type_ids`` (vLLM sends them on only
    then): ``model_input_names`` in ``tokenizer_config.json``, else the BERT family's."""
    names = config.get("model_input_names")
    if isinstance(names, list):
        return "token_type_ids" in names
    cls = config.get("tokenizer_class")
    return isinstance(cls, str) and cls.startswith(("Bert", "Electra"))


class Tokenizer:
    """A fast (Rust) HF tokenizer plus the parts of ``tokenizer_config.json`` a gateway needs.

    ``hf`` is a ``tokenizers.Tokenizer``; ``config`` the parsed ``tokenizer_config.json``
    (special tokens as strings or ``{"content": ...}`` dicts, ``chat_template`` as a string or
    a list of ``{name, template}``, ``add_bos_token`` / ``add_eos_token``). Ids are ints in
    ``[0, vocab_size)``; an id outside the vocabulary decodes to ``""``. Truncation and
    padding configured in ``tokenizer.json`` are disabled. Raises ``ValueError`` if a chat
    template does not compile.
    """

    def __init__(
        self,
        hf: Any,
        config: Mapping[str, Any] | None = None,
        *,
        chat_templates: Mapping[str, str] | None = None,
        name_or_path: str = "",
        content_format: str = "auto",
    ) -> None:
        config = dict(config or {})
        self.hf = hf
        self.name_or_path = name_or_path
        # encode_batch_fast skips the offsets (the same ids, faster) and releases the GIL for
        # the whole encode, where encode holds it while it builds the result (measured in
        # docs/performance.md); tokenizers < 0.20 lacks it.
        self._encode_batch: Any = getattr(hf, "encode_batch_fast", hf.encode_batch)
        hf.no_truncation()
        hf.no_padding()
        self._token_types = _gives_token_types(config)

        self.special_tokens: dict[str, str] = {}
        for key in SPECIAL_TOKEN_KEYS:
            content = _token_content(config.get(key))
            if content is not None:
                self.special_tokens[key] = content
        extra = config.get("additional_special_tokens") or []
        self.additional_special_tokens: list[str] = [
            c for c in (_token_content(t) for t in extra) if c is not None
        ]

        decoder = hf.get_added_tokens_decoder()
        #: Added tokens (special or not), content -> id.
        self.added_tokens: dict[str, int] = {tok.content: i for i, tok in decoder.items()}
        special = {i for i, tok in decoder.items() if tok.special}
        for content in (*self.special_tokens.values(), *self.additional_special_tokens):
            tid = hf.token_to_id(content)
            if tid is not None:
                special.add(tid)
        #: Ids of special tokens: added tokens flagged special plus the configured ones.
        self.special_ids: frozenset[int] = frozenset(special)

        self.bos_token: str | None = self.special_tokens.get("bos_token")
        self.eos_token: str | None = self.special_tokens.get("eos_token")
        self.pad_token: str | None = self.special_tokens.get("pad_token")
        self.bos_token_id: int | None = self.token_to_id(self.bos_token)
        self.eos_token_id: int | None = self.token_to_id(self.eos_token)
        self.pad_token_id: int | None = self.token_to_id(self.pad_token)

        # add_bos_token / add_eos_token apply only where the post-processor does not already
        # add them (transformers rewrites the post-processor; we top it up instead).
        probe = hf.encode("", add_special_tokens=True).ids
        self._bos_prefix: list[int] = []
        self._eos_suffix: list[int] = []
        bos, eos = self.bos_token_id, self.eos_token_id
        if config.get("add_bos_token") and bos is not None and bos not in probe[:1]:
            self._bos_prefix = [bos]
        if config.get("add_eos_token") and eos is not None and eos not in probe[-1:]:
            self._eos_suffix = [eos]

        if chat_templates is None:
            chat_templates = _parse_templates(config.get("chat_template"))
        #: Compiled chat templates by name (``"default"`` for a single string template).
        self.chat_templates: dict[str, ChatTemplate] = {
            name: ChatTemplate(src, name=name, content_format=content_format)
            for name, src in chat_templates.items()
        }
        #: ``--chat-template-content-format`` (per-request templates use it too).
        self.content_format = content_format
        self._text_cache: dict[int, str] = {}
        #: The longest token in input characters (``None``: no safe bound; see
        #: :mod:`smg_trio.tokenizer.bound`): a text of ``c`` characters has at least
        #: ``ceil(c / max_token_chars)`` tokens.
        self.max_token_chars: int | None = max_token_chars(hf)
        # encode_batch (not _fast): the prefix bound needs word ids and offsets.
        self._encode_words: Any = hf.encode_batch
        deterministic, self._normalizes, self._margin = prefix_bound_ok(hf)
        self._prefix_bound = deterministic and self.max_token_chars is not None

    @classmethod
    def from_dir(
        cls,
        model_dir: str | Path | ModelDir,
        *,
        chat_template: str | None = None,
        content_format: str = "auto",
    ) -> Tokenizer:
        """Load ``tokenizer.json`` and ``tokenizer_config.json`` from a local model directory.

        ``chat_template`` (Jinja source, vLLM's ``--chat-template``) replaces the model's own
        templates; ``content_format`` is vLLM's ``--chat-template-content-format``. A
        :class:`~smg_trio.tokenizer.modeldir.ModelDir` with roots confines every file read.
        Raises ``FileNotFoundError`` if there is no ``tokenizer.json`` (slow-only tokenizers
        are not supported), ``ValueError`` for malformed config or a template that does not
        compile, and ``ModelPathError`` for a file that resolves outside the roots.
        """
        from tokenizers import Tokenizer as HfTokenizer

        md = model_dir if isinstance(model_dir, ModelDir) else ModelDir(model_dir)
        text = md.read_text("tokenizer.json")
        if text is None:
            path = md.path / "tokenizer.json"
            raise FileNotFoundError(f"{path} not found: a fast tokenizer.json is required")
        config = load_model_json(md, "tokenizer_config.json")
        templates = (
            {"default": chat_template} if chat_template is not None else _load_templates(md, config)
        )
        return cls(
            HfTokenizer.from_str(text),
            config,
            chat_templates=templates,
            name_or_path=str(md.path),
            content_format=content_format,
        )

    # -- ids <-> text ------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """Number of ids including added tokens."""
        return int(self.hf.get_vocab_size(with_added_tokens=True))

    def token_to_id(self, token: str | None) -> int | None:
        """The id of a vocabulary or added token string, or ``None``."""
        if token is None:
            return None
        tid = self.hf.token_to_id(token)
        return None if tid is None else int(tid)

    def id_to_token(self, token_id: int) -> str | None:
        """The raw vocabulary string of an id (byte-level form, e.g. ``"Ġworld"``), or ``None``."""
        tok = self.hf.id_to_token(token_id)
        return None if tok is None else str(tok)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``. ``add_special_tokens`` applies the post-processor and
        ``add_bos_token`` / ``add_eos_token``; chat prompts are encoded without them."""
        ids: list[int] = self._encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        if add_special_tokens and (self._bos_prefix or self._eos_suffix):
            ids = [*self._bos_prefix, *ids, *self._eos_suffix]
        return ids

    def encode_pair(self, first: str, second: str) -> tuple[list[int], int | None]:
        """A cross-encoder's input: ``first`` and ``second`` as the tokenizer pairs them
        (``tokenizer(text=first, text_pair=second)``, special tokens on: the post-processor's
        pair template, and ``add_bos_token`` / ``add_eos_token`` around each text as
        transformers' fast tokenizers add them), and where the second text's token type
        starts (``None`` when the tokenizer gives no second type)."""
        enc = self.hf.encode(first, second, add_special_tokens=True)
        ids: list[int] = list(enc.ids)
        types: list[int] = list(enc.type_ids)
        if self._bos_prefix or self._eos_suffix:
            a = self.hf.encode(first, add_special_tokens=False).ids
            b = self.hf.encode(second, add_special_tokens=False).ids
            head = [*self._bos_prefix, *a, *self._eos_suffix]
            tail = [*self._bos_prefix, *b, *self._eos_suffix]
            ids, types = head + tail, [0] * len(head) + [1] * len(tail)
        if not self._token_types:
            return ids, None
        start = next((i for i, t in enumerate(types) if t == 1), None)
        return ids, start

    def min_tokens(self, text: str, limit: int) -> int:
        """At least how many tokens ``text`` encodes to (without special tokens), for a
        context of ``limit`` tokens, without encoding it whole: from its length and the
        longest token, and for a text longer than ``limit`` times
        :data:`~smg_trio.tokenizer.prefix.PREFIX_CHARS_PER_TOKEN` characters from encoding
        that long a prefix (:mod:`smg_trio.tokenizer.prefix`). 0 when the pipeline allows no
        safe bound."""
        longest = self.max_token_chars
        if longest is None:
            return 0
        if not self._prefix_bound:
            return min_tokens(len(text), longest)
        return prefix_min_tokens(
            self._encode_words,
            text,
            limit,
            longest,
            normalizes=self._normalizes,
            margin=self._margin,
        )

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids``; invalid UTF-8 becomes U+FFFD. Ids outside the vocabulary are
        dropped; negative ids raise ``OverflowError``."""
        return str(self.hf.decode(ids, skip_special_tokens=skip_special_tokens))

    def token_text(self, token_id: int) -> str:
        """Text of one id decoded alone with special tokens kept (cached). A token holding
        part of a multi-byte UTF-8 character yields U+FFFD."""
        text = self._text_cache.get(token_id)
        if text is None:
            text = self._text_cache[token_id] = self.decode([token_id], skip_special_tokens=False)
        return text

    def token_bytes(self, token_id: int) -> list[int]:
        """UTF-8 bytes of :meth:`token_text` as ints 0-255 (OpenAI ``logprobs[].bytes``)."""
        return list(self.token_text(token_id).encode("utf-8"))

    # -- chat ---------------------------------------------------------------------------------

    @property
    def has_chat_template(self) -> bool:
        """Whether the model ships at least one chat template."""
        return bool(self.chat_templates)

    def get_chat_template(
        self, name: str | None = None, *, has_tools: bool = False
    ) -> ChatTemplate:
        """Pick a template like transformers: ``name`` if given; else ``"tool_use"`` when
        tools are present and it exists; else ``"default"``; else the only one. Raises
        ``ValidationError`` when the model has no chat template and ``ValueError`` for an
        unknown ``name``."""
        templates = self.chat_templates
        if not templates:
            raise ValidationError(
                "this model has no chat template; start the gateway with --chat-template, "
                "or use /v1/completions with a raw prompt",
                param="messages",
                code="no_chat_template",
            )
        if name is not None:
            if name not in templates:
                raise ValueError(f"unknown chat template {name!r}; have {sorted(templates)}")
            return templates[name]
        if has_tools and "tool_use" in templates:
            return templates["tool_use"]
        if "default" in templates:
            return templates["default"]
        if len(templates) == 1:
            return next(iter(templates.values()))
        raise ValueError(f"no default chat template among {sorted(templates)}")

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = False,
        continue_final_message: bool = False,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        template_name: str | None = None,
        template: ChatTemplate | None = None,
    ) -> str:
        """Render a chat to its prompt string (see :meth:`ChatTemplate.render`) with
        ``template`` (a request's own), else the model's; encode the result with
        ``add_special_tokens=False``. Raises ``ValidationError`` (400)."""
        if template is None:
            template = self.get_chat_template(template_name, has_tools=bool(tools))
        special: dict[str, Any] = dict(self.special_tokens)
        special["additional_special_tokens"] = list(self.additional_special_tokens)
        return template.render(
            messages,
            tools=tools,
            documents=documents,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            special_tokens=special,
            chat_template_kwargs=chat_template_kwargs,
        )
