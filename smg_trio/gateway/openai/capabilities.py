"""Renders the per-engine ``Capabilities`` table and the OpenAI field mapping as Markdown
(``docs/capabilities.md`` is this output; a test keeps the two equal)."""

from __future__ import annotations

from collections.abc import Sequence

from smg_trio.protocol.types import Capabilities

__all__ = ["FIELD_MAP", "render_capabilities"]

_STRUCTURED_PARAMS = {
    "json": "`response_format` json_schema, `guided_json`, `structured_outputs.json`",
    "json_object": "`response_format` json_object, `structured_outputs.json_object`",
    "regex": "`guided_regex`, `structured_outputs.regex`",
    "choice": "`guided_choice`, `structured_outputs.choice`",
    "grammar": "`guided_grammar`, `structured_outputs.grammar`",
    "structural_tag": "`response_format` structural_tag, `structured_outputs.structural_tag`",
}

#: OpenAI/vLLM request field -> what the gateway does with it (same for every engine unless
#: the capability table says otherwise).
FIELD_MAP: tuple[tuple[str, str], ...] = (
    ("`max_completion_tokens`, `max_tokens`", "engine max tokens; `max_completion_tokens` wins when both are set; `null` = unset; >= 1 (completions: 0 only with `echo`); unset on vLLM = context left"),
    ("`temperature`, `top_p`, `top_k`, `min_p`", "sent as is after range checks (temperature >= 0, top_p in (0, 1], top_k >= -1, min_p in [0, 1])"),
    ("`presence_penalty`, `frequency_penalty`, `repetition_penalty`", "sent (penalties in [-2, 2], repetition > 0)"),
    ("`seed`", "sent; must be in the engine's range (the `seed` range row: vLLM any int64, as vLLM 0.32); sub-request i of n gets `seed + i`, wrapped mod 2^63 past the top"),
    ("`stop`", "matched in the gateway on detokenized text with hold-back; single-token stops also go to the engine as stop token ids; a gateway match aborts the engine request"),
    ("`stop_token_ids`, `ignore_eos`, `min_tokens`", "sent; EOS ids from the model directory are sent unless `ignore_eos`"),
    ("`include_stop_str_in_output`, `skip_special_tokens`, `spaces_between_special_tokens`", "applied in the gateway's detokenizer"),
    ("`logit_bias`", "sent (keys are token ids in the vocabulary, values clamped to [-100, 100] as vLLM does; one 400 names every bad key)"),
    ("`logprobs` / `top_logprobs` (chat), `logprobs` (completions)", "engine logprobs = k; rendered in the OpenAI chat shape or the legacy completions shape"),
    ("`echo` + `logprobs` (completions), `prompt_logprobs`", "engine prompt logprobs"),
    ("`response_format`, `guided_*`, `structured_outputs`", "one structured-output constraint; more than one is a 400"),
    ("`tools`, `tool_choice`, `parallel_tool_calls`", "function tools only; `tool_choice` auto (needs `--enable-auto-tool-choice --tool-call-parser NAME`), none, required and a named function (a JSON constraint, counted as the request's one structured output): see the `tool_choice` rows and [tools.md](tools.md)"),
    ("`data_parallel_rank`", "sent; must name one of the worker's engines"),
    ("`n`", "n single-sample sub-requests `{id}-{i}` in one nursery; at most `max_n`"),
    ("`priority`", "vLLM: sent (lower is served first under the engine's `--scheduling-policy priority`); a signed 64-bit integer; the gateway's admission queue orders by it on every engine. TokenSpeed: != 0 is a 400 (its request has no priority)"),
    ("`truncate_prompt_tokens`, `truncation_side`", "the encoded prompt is cut to that many tokens (-1: the context less one), the last ones unless `truncation_side` is `right`, as vLLM 0.32's renderer does"),
    ("`kv_transfer_params`", "vLLM: sent in `extra_args`, the engine's returned at the top of the response; TokenSpeed: 400"),
    ("`best_of` > 1, `use_beam_search`, `suffix`", "400 naming the field (not supported by this gateway)"),
    ("chat `echo`", "the last message's text leads the reply when its role is the reply's (`assistant` with `add_generation_prompt`, else the last message's), as vLLM 0.32"),
)  # fmt: skip


def _yes(flag: bool) -> str:
    return "yes" if flag else "**no** (400)"


def _row(name: str, caps: Sequence[Capabilities], cell: object) -> str:
    cells = [str(cell(c)) if callable(cell) else str(cell) for c in caps]
    return f"| {name} | " + " | ".join(cells) + " |"


def render_capabilities(caps: Sequence[Capabilities]) -> str:
    """The Markdown document: one column per engine, then the field mapping."""
    kinds = ("json", "json_object", "regex", "choice", "grammar", "structural_tag")
    lines = [
        "# Engine capabilities",
        "",
        "Generated from `smg_trio.protocol` (`Capabilities` of each engine protocol) by",
        "`smg_trio.gateway.openai.capabilities.render_capabilities`; a test keeps this file current.",
        "A field an engine cannot carry is rejected with HTTP 400 naming the field",
        '(`code: "unsupported_field"`); nothing is dropped silently.',
        "",
        "| capability | " + " | ".join(c.engine for c in caps) + " |",
        "|---" * (len(caps) + 1) + "|",
        _row("top logprobs per token (max k)", caps, lambda c: c.max_top_logprobs),
        _row("prompt logprobs", caps, lambda c: _yes(c.prompt_logprobs)),
        _row("`logit_bias`", caps, lambda c: _yes(c.logit_bias)),
        _row("`min_p`", caps, lambda c: _yes(c.min_p)),
        _row("`data_parallel_rank`", caps, lambda c: _yes(c.data_parallel_rank)),
        _row(
            "default `max_tokens`",
            caps,
            lambda c: (
                "context left" if c.default_max_tokens_is_remaining_context else "engine default"
            ),
        ),
        _row("`seed` range", caps, lambda c: f"[{c.seed_min}, {c.seed_max}]"),
        _row("`model` naming a LoRA adapter", caps, lambda c: _yes(c.lora_adapters)),
        _row(
            "pooling: `/v1/embeddings`, `/v2/embed`, `/pooling`, `/classify`, `/score`, `/rerank` ([pooling.md](pooling.md))",
            caps,
            lambda c: _yes(c.pooling),
        ),
    ]
    for kind in kinds:
        lines.append(
            _row(
                f"structured output `{kind}` ({_STRUCTURED_PARAMS[kind]})",
                caps,
                lambda c, k=kind: _yes(k in c.structured_outputs),
            )
        )
    lines.append(_row("`tool_choice` auto, none (parsed in the gateway)", caps, "yes"))
    lines.append(
        _row(
            "`tool_choice` required, named function (a JSON-schema constraint)",
            caps,
            lambda c: _yes("json" in c.structured_outputs),
        )
    )
    lines += ["", "## Request fields", "", "| field | handling |", "|---|---|"]
    lines += [f"| {field} | {how} |" for field, how in FIELD_MAP]
    return "\n".join(lines) + "\n"
