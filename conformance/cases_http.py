"""Response-shape cases: models list, chat and completions (plain, streamed, n=2), logprobs."""

from __future__ import annotations

from typing import Any

from conformance.case import Case, CaseFailed, CaseSkipped, fail_if, register
from conformance.checks import (
    FINISH_OK,
    dedupe,
    error_problems,
    is_int,
    stream_problems,
    usage_problems,
)
from conformance.client import Context, Reply
from conformance.sse import parse_sse

__all__ = ["CASES", "ok_json"]

CASES: list[Case] = []
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
SEED = 1234


def ok_json(reply: Reply, what: str) -> dict[str, Any]:
    """The JSON object of a 200 ``application/json`` reply, or :class:`CaseFailed`."""
    if reply.status != 200:
        raise CaseFailed(f"{what}: expected HTTP 200, got {reply.status}: {reply.snippet()!r}")
    if not reply.content_type.startswith("application/json"):
        raise CaseFailed(f"{what}: Content-Type is {reply.content_type!r}, not application/json")
    return reply.json_object()


def sse_ok(reply: Reply, what: str) -> list[str]:
    """Problems with the status and Content-Type of a streaming reply (fatal if not 200)."""
    if reply.status != 200:
        raise CaseFailed(f"{what}: expected HTTP 200, got {reply.status}: {reply.snippet()!r}")
    if not reply.content_type.startswith("text/event-stream"):
        return [f"{what}: Content-Type is {reply.content_type!r}, not text/event-stream"]
    return []


def loud_rejection(reply: Reply, field_name: str) -> str | None:
    """A note when ``reply`` is a well-formed 400 that names ``field_name``, else None."""
    if reply.status != 400:
        return None
    problems, note = error_problems(reply, {400}, field_name=field_name, require_named=True)
    if problems or note:
        return None
    message = reply.json_object()["error"].get("message")
    return f"rejected loudly with 400: {message!r}"


def skip_if_n_rejected(reply: Reply) -> None:
    """Skip an n>1 case when the server loudly refuses n>1 (a documented, honest limitation)."""
    note = loud_rejection(reply, "n")
    if note is not None:
        raise CaseSkipped(f"n=2 is not supported by this server ({note})")


def prompt_counted_once(ctx: Context, usage: dict[str, Any], where: str) -> list[str]:
    """Problems when ``usage.prompt_tokens`` differs from the n=1 request's prompt_tokens."""
    try:
        baseline = baseline_prompt_tokens(ctx)
    except CaseFailed as exc:
        return [str(exc)]
    if usage.get("prompt_tokens") != baseline:
        return [
            f"{where} prompt_tokens {usage.get('prompt_tokens')} != n=1 prompt_tokens {baseline}"
        ]
    return []


def baseline_prompt_tokens(ctx: Context) -> int:
    """prompt_tokens of the n=1 chat request, cached for the run."""
    cached = ctx.memo("chat_prompt_tokens")
    if isinstance(cached, int):
        return cached
    body = ok_json(ctx.post_json(CHAT, ctx.chat_body()), "baseline n=1 chat request")
    usage = body.get("usage")
    fail_if(usage_problems(usage, where="baseline n=1 usage"))
    assert isinstance(usage, dict)
    value = usage["prompt_tokens"]
    assert isinstance(value, int)
    ctx.remember("chat_prompt_tokens", value)
    return value


def _envelope_problems(body: dict[str, Any], obj: str) -> list[str]:
    out: list[str] = []
    if body.get("object") != obj:
        out.append(f"object is {body.get('object')!r}, expected {obj!r}")
    if not isinstance(body.get("id"), str) or not body["id"]:
        out.append(f"id is not a non-empty string: {body.get('id')!r}")
    if not is_int(body.get("created")):
        out.append(f"created is not an integer: {body.get('created')!r}")
    if not isinstance(body.get("model"), str) or not body["model"]:
        out.append(f"model is not a non-empty string: {body.get('model')!r}")
    return out


def _choices(body: dict[str, Any], n: int) -> tuple[list[dict[str, Any]], list[str]]:
    choices = body.get("choices")
    if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
        raise CaseFailed(f"choices is not a list of objects: {choices!r}")
    out: list[str] = []
    if len(choices) != n:
        out.append(f"expected {n} choices, got {len(choices)}")
    indexes = [c.get("index") for c in choices]
    if indexes != list(range(len(choices))):
        out.append(f"choice indexes are {indexes}, expected {list(range(len(choices)))} in order")
    for c in choices:
        if c.get("finish_reason") not in FINISH_OK:
            out.append(
                f"choice {c.get('index')} finish_reason {c.get('finish_reason')!r} "
                f"not in {sorted(FINISH_OK)}"
            )
    return choices, out


def _length_problems(choices: list[dict[str, Any]], usage: object, max_tokens: int) -> list[str]:
    if len(choices) != 1 or not isinstance(usage, dict):
        return []
    completion = usage.get("completion_tokens")
    if (
        choices[0].get("finish_reason") == "length"
        and is_int(completion)
        and completion != max_tokens
    ):
        return [
            f"finish_reason 'length' but completion_tokens {completion} != max_tokens {max_tokens}"
        ]
    return []


# -- models --------------------------------------------------------------------------------


@register(
    CASES,
    "models_list",
    "GET /v1/models answers {object: list, data: [{id, object: model}]} and lists the model",
    "OpenAI models API; clients discover the served model name here before sending requests.",
)
def models_list(ctx: Context) -> str:
    body = ok_json(ctx.request("GET", "/v1/models"), "GET /v1/models")
    problems: list[str] = []
    if body.get("object") != "list":
        problems.append(f"object is {body.get('object')!r}, expected 'list'")
    data = body.get("data")
    if not isinstance(data, list):
        raise CaseFailed(f"data is not a list: {data!r}")
    ids = [m.get("id") for m in data if isinstance(m, dict)]
    if ctx.model not in ids:
        problems.append(f"model {ctx.model!r} not listed; ids: {ids}")
    for m in data:
        if not isinstance(m, dict) or not isinstance(m.get("id"), str):
            problems.append(f"entry without a string id: {m!r}")
        elif m.get("object") != "model":
            problems.append(f"entry {m['id']!r} has object {m.get('object')!r}, expected 'model'")
    fail_if(dedupe(problems))
    return f"{len(ids)} model(s) listed"


# -- chat ----------------------------------------------------------------------------------


@register(
    CASES,
    "chat_basic",
    "non-streaming chat: chat.completion envelope, assistant message, finish_reason, usage sums",
    "OpenAI chat.completion object; usage.total_tokens = prompt + completion (billing depends on "
    "it, B03); finish_reason 'length' means exactly max_tokens tokens were generated (B09).",
)
def chat_basic(ctx: Context) -> str:
    request = ctx.chat_body()
    body = ok_json(ctx.post_json(CHAT, request), "chat")
    problems = _envelope_problems(body, "chat.completion")
    choices, more = _choices(body, 1)
    problems += more
    message = choices[0].get("message") if choices else None
    if not isinstance(message, dict):
        problems.append(f"choices[0].message is not an object: {message!r}")
    else:
        if message.get("role") != "assistant":
            problems.append(f"message.role is {message.get('role')!r}, expected 'assistant'")
        if not isinstance(message.get("content"), str):
            problems.append(f"message.content is not a string: {message.get('content')!r}")
    usage = body.get("usage")
    problems += usage_problems(usage, max_completion=request["max_tokens"])
    problems += _length_problems(choices, usage, request["max_tokens"])
    fail_if(problems)
    content = message.get("content") if isinstance(message, dict) else ""
    return f"finish_reason={choices[0].get('finish_reason')} content={content!r:.60}"


@register(
    CASES,
    "chat_stream",
    "streaming chat: text/event-stream, 'data: ' frames, role first, one finish_reason, one [DONE] last",
    "OpenAI streaming format; clients split on blank lines and stop at [DONE] (a duplicate or "
    "missing [DONE], or several finish_reasons, breaks SDK parsers); B01: the final tokens must "
    "arrive before the finish.",
)
def chat_stream(ctx: Context) -> str:
    reply = ctx.post_json(CHAT, ctx.chat_body(stream=True))
    problems = sse_ok(reply, "chat stream")
    sse = parse_sse(reply.body)
    more, summary = stream_problems(sse.events, kind="chat")
    fail_if(problems + sse.problems + more)
    return f"{len(sse.events)} chunks, finish_reason={summary.finish.get(0)}"


# -- completions ---------------------------------------------------------------------------


@register(
    CASES,
    "completions_basic",
    "non-streaming completions: text_completion envelope, choices[0].text, finish_reason, usage",
    "OpenAI legacy completions object; usage.total_tokens = prompt + completion (B03).",
)
def completions_basic(ctx: Context) -> str:
    request = ctx.completion_body()
    body = ok_json(ctx.post_json(COMPLETIONS, request), "completions")
    problems = _envelope_problems(body, "text_completion")
    choices, more = _choices(body, 1)
    problems += more
    if choices and not isinstance(choices[0].get("text"), str):
        problems.append(f"choices[0].text is not a string: {choices[0].get('text')!r}")
    usage = body.get("usage")
    problems += usage_problems(usage, max_completion=request["max_tokens"])
    problems += _length_problems(choices, usage, request["max_tokens"])
    fail_if(problems)
    return f"finish_reason={choices[0].get('finish_reason')} text={choices[0].get('text')!r:.60}"


@register(
    CASES,
    "completions_stream",
    "streaming completions: text_completion chunks, one finish_reason, one [DONE] last",
    "OpenAI streaming completions format (same SSE framing rules as chat).",
)
def completions_stream(ctx: Context) -> str:
    reply = ctx.post_json(COMPLETIONS, ctx.completion_body(stream=True))
    problems = sse_ok(reply, "completions stream")
    sse = parse_sse(reply.body)
    more, summary = stream_problems(sse.events, kind="completion")
    fail_if(problems + sse.problems + more)
    return f"{len(sse.events)} chunks, finish_reason={summary.finish.get(0)}"


# -- n = 2 ---------------------------------------------------------------------------------


def _n2_body(ctx: Context, **extra: Any) -> dict[str, Any]:
    # temperature > 0: some engines refuse n > 1 under greedy sampling.
    return ctx.chat_body(n=2, temperature=0.7, seed=SEED, **extra)


@register(
    CASES,
    "chat_n2",
    "n=2 chat: two choices indexed 0 and 1 in order; prompt_tokens counted once",
    "OpenAI n semantics; B05 (fewer than n choices), B04 (indexes); the prompt is billed once, "
    "so prompt_tokens must equal the n=1 value and completion_tokens covers both choices.",
)
def chat_n2(ctx: Context) -> str:
    request = _n2_body(ctx)
    reply = ctx.post_json(CHAT, request)
    skip_if_n_rejected(reply)
    body = ok_json(reply, "n=2 chat")
    problems = _envelope_problems(body, "chat.completion")
    choices, more = _choices(body, 2)
    problems += more
    for c in choices:
        msg = c.get("message")
        if not isinstance(msg, dict) or not isinstance(msg.get("content"), str):
            problems.append(f"choice {c.get('index')} has no string message.content")
    usage = body.get("usage")
    problems += usage_problems(usage, max_completion=2 * request["max_tokens"])
    if isinstance(usage, dict) and is_int(usage.get("completion_tokens")):
        if usage["completion_tokens"] < 2:
            problems.append(f"completion_tokens {usage['completion_tokens']} < 2 for two choices")
        problems += prompt_counted_once(ctx, usage, "n=2")
    fail_if(problems)
    return "2 choices, usage consistent"


@register(
    CASES,
    "chat_n2_stream_usage",
    "n=2 streaming with include_usage: indexes 0/1, one finish each, one usage chunk before [DONE]",
    "B04 (every chunk index 0 merges two completions), B05 ([DONE] only after all choices "
    "finish), B03 (usage in the final chunk, prompt counted once: equal to the n=1 value).",
)
def chat_n2_stream_usage(ctx: Context) -> str:
    reply = ctx.post_json(CHAT, _n2_body(ctx, stream=True, stream_options={"include_usage": True}))
    skip_if_n_rejected(reply)
    problems = sse_ok(reply, "n=2 stream")
    sse = parse_sse(reply.body)
    more, summary = stream_problems(sse.events, kind="chat", n=2, include_usage=True)
    problems += sse.problems + more
    usage = summary.usage
    if usage is not None and is_int(usage.get("completion_tokens")):
        if usage["completion_tokens"] < 2:
            problems.append(f"completion_tokens {usage['completion_tokens']} < 2 for two choices")
        problems += prompt_counted_once(ctx, usage, "n=2 stream")
    fail_if(problems)
    return f"{len(sse.events)} chunks, usage={usage}"


# -- stream vs non-stream ------------------------------------------------------------------


def _compare(ctx: Context, path: str, kind: str, request: dict[str, Any]) -> str:
    plain = ok_json(ctx.post_json(path, request), f"non-streaming {kind}")
    choices = plain.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise CaseFailed(f"non-streaming choices malformed: {choices!r}")
    if kind == "chat":
        message = choices[0].get("message")
        want = message.get("content") if isinstance(message, dict) else None
    else:
        want = choices[0].get("text")
    streamed = ctx.post_json(
        path, {**request, "stream": True, "stream_options": {"include_usage": True}}
    )
    if streamed.status != 200:
        raise CaseFailed(f"streaming {kind}: HTTP {streamed.status}: {streamed.snippet()!r}")
    sse = parse_sse(streamed.body)
    _, summary = stream_problems(
        sse.events, kind="chat" if kind == "chat" else "completion", include_usage=True
    )
    got = summary.texts.get(0, "")
    problems: list[str] = []
    if got != (want or ""):
        problems.append(f"streamed text {got!r} != non-streamed text {want!r}")
    finish = summary.finish.get(0, [])
    if finish[-1:] != [choices[0].get("finish_reason")]:
        problems.append(
            f"streamed finish {finish} != non-streamed {choices[0].get('finish_reason')!r}"
        )
    plain_usage, stream_usage = plain.get("usage"), summary.usage
    if isinstance(plain_usage, dict) and isinstance(stream_usage, dict):
        for key in ("prompt_tokens", "completion_tokens"):
            if plain_usage.get(key) != stream_usage.get(key):
                problems.append(
                    f"streamed usage.{key} {stream_usage.get(key)} != non-streamed {plain_usage.get(key)}"
                )
    else:
        problems.append(f"usage missing (non-streamed {plain_usage!r}, streamed {stream_usage!r})")
    fail_if(problems)
    return f"{len(got)} chars identical"


@register(
    CASES,
    "chat_stream_matches",
    "chat at temperature 0 with a seed: streamed text, finish_reason and usage equal non-streamed",
    "B01 (final tokens dropped when the finish arrives with tokens), B03 (streaming "
    "completion_tokens must be counted, not copied from one message).",
)
def chat_stream_matches(ctx: Context) -> str:
    return _compare(ctx, CHAT, "chat", ctx.chat_body(seed=SEED))


@register(
    CASES,
    "completions_stream_matches",
    "completions at temperature 0 with a seed: streamed text, finish_reason and usage equal non-streamed",
    "B01 and B03, on the completions endpoint.",
)
def completions_stream_matches(ctx: Context) -> str:
    return _compare(ctx, COMPLETIONS, "completion", ctx.completion_body(seed=SEED))


# -- logprobs ------------------------------------------------------------------------------


def _chat_logprob_entries(body: dict[str, Any], top: int) -> tuple[list[str], int]:
    problems: list[str] = []
    choices = body.get("choices") or [{}]
    logprobs = choices[0].get("logprobs") if isinstance(choices[0], dict) else None
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(content, list) or not content:
        return [f"choices[0].logprobs.content is missing or empty: logprobs={logprobs!r:.200}"], 0
    for pos, entry in enumerate(content):
        where = f"logprobs.content[{pos}]"
        if not isinstance(entry, dict):
            problems.append(f"{where} is not an object")
            continue
        problems += _token_logprob_problems(entry, where)
        alts = entry.get("top_logprobs")
        if not isinstance(alts, list):
            problems.append(f"{where}.top_logprobs is not a list: {alts!r}")
            continue
        if len(alts) > top:
            problems.append(f"{where}.top_logprobs has {len(alts)} entries, asked for {top}")
        for alt in alts:
            if isinstance(alt, dict):
                problems += _token_logprob_problems(alt, f"{where}.top_logprobs[]")
            else:
                problems.append(f"{where}.top_logprobs entry is not an object: {alt!r}")
    usage = body.get("usage")
    completion = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if is_int(completion) and completion != len(content):
        problems.append(
            f"{len(content)} logprobs.content entries for {completion} completion tokens"
        )
    return dedupe(problems), len(content)


def _token_logprob_problems(entry: dict[str, Any], where: str) -> list[str]:
    out: list[str] = []
    if not isinstance(entry.get("token"), str):
        out.append(f"{where}.token is not a string")
    lp = entry.get("logprob")
    if not isinstance(lp, int | float) or isinstance(lp, bool) or lp > 0:
        out.append(f"{where}.logprob is not a number <= 0: {lp!r}")
    raw = entry.get("bytes")
    if raw is not None and (
        not isinstance(raw, list) or not all(is_int(b) and 0 <= b < 256 for b in raw)
    ):
        out.append(f"{where}.bytes is not a list of byte values: {raw!r:.80}")
    if "bytes" not in entry:
        out.append(f"{where} has no bytes field")
    return out


@register(
    CASES,
    "logprobs_chat_top",
    "chat logprobs:true, top_logprobs:2: one content entry per token with token/logprob/bytes/top_logprobs(<=2)",
    "OpenAI chat logprobs shape; B15. A loud 400 naming logprobs is acceptable, a 500 or a "
    "silent null is not.",
)
def logprobs_chat_top(ctx: Context) -> str:
    reply = ctx.post_json(CHAT, ctx.chat_body(logprobs=True, top_logprobs=2))
    note = loud_rejection(reply, "top_logprobs") or loud_rejection(reply, "logprobs")
    if note is not None:
        return note
    problems, count = _chat_logprob_entries(ok_json(reply, "chat logprobs"), 2)
    fail_if(problems)
    return f"{count} token entries"


@register(
    CASES,
    "logprobs_chat_default",
    "chat logprobs:true without top_logprobs: 200 with top_logprobs [] on every entry",
    "B15a (vllm#4795: logprobs:true alone raised an error). top_logprobs defaults to 0.",
)
def logprobs_chat_default(ctx: Context) -> str:
    reply = ctx.post_json(CHAT, ctx.chat_body(logprobs=True))
    note = loud_rejection(reply, "logprobs")
    if note is not None:
        other = ctx.post_json(CHAT, ctx.chat_body(logprobs=True, top_logprobs=1))
        if other.status == 200:
            raise CaseFailed(
                "logprobs:true alone is rejected while logprobs:true, top_logprobs:1 is "
                f"accepted (B15a): {note}"
            )
        return note
    body = ok_json(reply, "chat logprobs:true")
    problems, count = _chat_logprob_entries(body, 0)
    fail_if(problems)
    return f"{count} token entries, top_logprobs []"


@register(
    CASES,
    "logprobs_completions",
    "completions logprobs:1: tokens, token_logprobs, top_logprobs, text_offset of equal length",
    "OpenAI legacy completions logprobs shape; B15d. A loud 400 naming logprobs is acceptable, "
    "a 500 or a silent null is not.",
)
def logprobs_completions(ctx: Context) -> str:
    reply = ctx.post_json(COMPLETIONS, ctx.completion_body(logprobs=1, max_tokens=8))
    note = loud_rejection(reply, "logprobs")
    if note is not None:
        return note
    body = ok_json(reply, "completions logprobs")
    choices = body.get("choices") or [{}]
    logprobs = choices[0].get("logprobs") if isinstance(choices[0], dict) else None
    if not isinstance(logprobs, dict):
        raise CaseFailed(f"choices[0].logprobs is {logprobs!r} although logprobs:1 was asked")
    problems: list[str] = []
    keys = ("tokens", "token_logprobs", "top_logprobs", "text_offset")
    lists = {k: logprobs.get(k) for k in keys}
    for key, value in lists.items():
        if not isinstance(value, list):
            problems.append(f"logprobs.{key} is not a list: {value!r:.80}")
    fail_if(problems)
    lengths = {k: len(v) for k, v in lists.items() if isinstance(v, list)}
    if len(set(lengths.values())) != 1:
        problems.append(f"logprobs list lengths differ: {lengths}")
    usage = body.get("usage")
    completion = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if is_int(completion) and lengths["tokens"] != completion:
        problems.append(f"{lengths['tokens']} logprob tokens for {completion} completion tokens")
    for pos, alts in enumerate(lists["top_logprobs"] or []):
        # vLLM semantics: up to `logprobs` alternatives plus the sampled token.
        if alts is not None and (not isinstance(alts, dict) or len(alts) > 2):
            problems.append(f"top_logprobs[{pos}] is not a dict of <= 2 entries: {alts!r:.80}")
    offsets = lists["text_offset"] or []
    if not all(is_int(o) for o in offsets) or offsets != sorted(offsets):
        problems.append(f"text_offset is not a non-decreasing list of ints: {offsets!r:.80}")
    fail_if(dedupe(problems))
    return f"{lengths['tokens']} tokens"
