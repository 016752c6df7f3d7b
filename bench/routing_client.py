"""The routing benchmark's client process: multi-turn chat sessions over raw HTTP/1.1 keep-alive
connections on asyncio (uvloop if installed), reporting its own CPU.

Standard library only (plus optional uvloop), like ``bench/lean_client.py``. It reads a JSON
file of sessions (``{"system": str, "turns": [str, ...]}``), opens one connection per session,
prints ``ready`` and waits for a line on stdin, then runs every session at once: each turn is a
streamed chat whose messages are the system prompt, the earlier turns and the assistant's
answers to them, and the new user message. It prints one JSON line: requests, errors, the
TTFT of each request (written -> first content event), the cached tokens each answer's usage
reported (when the gateway reports them), its wall time and its own CPU time.

    python bench/routing_client.py --port 8080 --model M --sessions sessions.json --max-tokens 32

``bench/routing.py`` is the coordinator.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from aio_client import Conn, measured, open_conns, ready_then_go, run_loop
from http1 import HttpError

_DATA = b"data: "


class ChatConn(Conn):
    """One keep-alive connection carrying one session's streamed chats."""

    async def chat(self, port: int, body: bytes) -> tuple[float | None, str, int | None]:
        """(TTFT s, the answer's text, usage cached tokens or None) of one streamed chat."""
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        t0 = time.perf_counter()
        self.writer.write(head + body)
        status, chunked, length = await self._head()
        if status != 200 or not chunked:
            raise HttpError(f"HTTP {status}: {(await self._body(chunked, length))[:300]!r}")
        ttft = None
        text: list[str] = []
        cached = None
        pending = b""
        while chunk := await self._chunk():
            pending += chunk
            *events, pending = pending.split(b"\n\n")
            for ev in events:
                if not ev.startswith(_DATA) or ev == b"data: [DONE]":
                    continue
                obj = json.loads(ev[6:])
                if "error" in obj:
                    raise HttpError(f"error event: {ev[:300]!r}")
                for choice in obj.get("choices") or ():
                    content = (choice.get("delta") or {}).get("content")
                    if content:
                        if ttft is None:
                            ttft = time.perf_counter() - t0
                        text.append(content)
                usage = obj.get("usage")
                if usage:
                    details = usage.get("prompt_tokens_details") or {}
                    cached = details.get("cached_tokens", cached)
        return ttft, "".join(text), cached


async def run(args: argparse.Namespace, sessions: list[dict[str, Any]]) -> dict[str, Any]:
    conns = await open_conns(ChatConn, args.port, len(sessions), limit=1 << 22)
    await ready_then_go()
    out: dict[str, Any] = {"requests": 0, "errors": 0, "ttft_s": [], "cached": [], "first": ""}

    async def session(conn: ChatConn, spec: dict[str, Any]) -> None:
        messages: list[dict[str, str]] = [{"role": "system", "content": spec["system"]}]
        for turn in spec["turns"]:
            messages.append({"role": "user", "content": turn})
            body = {
                "model": args.model,
                "messages": messages,
                "max_tokens": args.max_tokens,
                "temperature": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            try:
                ttft, text, cached = await conn.chat(args.port, json.dumps(body).encode())
            except (HttpError, OSError, ValueError) as exc:
                out["errors"] += 1
                out["first"] = out["first"] or str(exc)[:300]
                return
            out["requests"] += 1
            if ttft is not None:
                out["ttft_s"].append(ttft)
            if cached is not None:
                out["cached"].append(cached)
            messages.append({"role": "assistant", "content": text})

    runs = [session(c, s) for c, s in zip(conns, sessions, strict=True)]
    await measured(out, runs, conns)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--sessions", required=True, metavar="FILE")
    p.add_argument("--max-tokens", type=int, default=32)
    args = p.parse_args()
    with open(args.sessions) as f:
        sessions = json.load(f)
    result = run_loop(run(args, sessions))
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
