"""The raw-bytes pass of .ci/fuzz.sh: malformed and random byte sequences, each on its own
connection, against a running ``serve``; the process must survive, still answer a normal
request afterwards, and log little (no traceback; at most :data:`LOG_BYTES_PER_CONNECTION`
bytes per connection on average). Issue 28 item 3: one WebSocket upgrade with a trailing
byte took the process down under ``--disable-fast-http1``.

Usage: python .ci/fuzz_raw.py BASE_URL SERVER_PID LOG_PATH [SEED]. Prints one line per
failure; exit 1 if any.
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import trio

#: The most connections open at once.
PARALLEL = 16
#: How long one connection is given to be answered and closed (seconds).
CONNECTION_S = 3.0
#: The log may grow by at most this many bytes per connection sent, on average.
LOG_BYTES_PER_CONNECTION = 300
#: Random sequences, and mutations of valid requests, per run.
RANDOM_CASES = 60

GET = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
POST_HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
BODY = b'{"model": "mock-tiny", "prompt": "hi", "max_tokens": 2}'
WS = b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
WS_KEY = b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
TLS_HELLO = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(64))

#: Named sequences: each is the list of writes on one connection.
FIXED: dict[str, list[bytes]] = {
    # truncated request lines and heads
    "empty line": [b"\r\n"],
    "method only": [b"GET"],
    "no version": [b"GET /"],
    "half version": [b"GET / HTTP/1."],
    "line, no head end": [b"GET / HTTP/1.1\r\n"],
    "head, no end": [b"GET / HTTP/1.1\r\nHost: x\r\n"],
    "header, no colon": [b"GET / HTTP/1.1\r\nHost x\r\n\r\n"],
    # upgrades with trailing bytes (the issue's) and other protocol switches
    "upgrade + X": [WS + b"\r\nX"],
    "upgrade with key + X": [WS + WS_KEY + b"\r\nX"],
    "upgrade + X later": [WS + WS_KEY + b"\r\n", b"X"],
    "upgrade + ws frame": [WS + WS_KEY + b"\r\n\x81\x85\x00\x00\x00\x00hello"],
    "upgrade + request": [WS + b"\r\n" + GET],
    "upgrade with body": [WS + b"Content-Length: 3\r\n\r\nabcX"],
    "upgrade, POST": [b"POST" + WS[3:] + b"Content-Length: 1\r\n\r\nXX"],
    "h2c upgrade + junk": [
        GET[:-2] + b"Connection: Upgrade, HTTP2-Settings\r\n"
        b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\njunk"
    ],
    "h2 preface": [H2_PREFACE],
    "h2 preface + frames": [H2_PREFACE + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00" + bytes(40)],
    "tls client hello": [TLS_HELLO],
    # framing: bad chunked, ambiguous and bad lengths
    "chunked, bad size": [POST_HEAD + b"Transfer-Encoding: chunked\r\n\r\nZZ\r\nabc\r\n0\r\n\r\n"],
    "chunked, negative": [POST_HEAD + b"Transfer-Encoding: chunked\r\n\r\n-5\r\nabc\r\n"],
    "chunked, huge": [POST_HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + b"f" * 40 + b"\r\nx"],
    "chunked, no crlf": [POST_HEAD + b"Transfer-Encoding: chunked\r\n\r\n3\r\nabcdef0\r\n\r\n"],
    "chunked, junk ext": [POST_HEAD + b"Transfer-Encoding: chunked\r\n\r\n3;\x00=\x01\r\nabc\r\n"],
    "chunked + junk after": [
        POST_HEAD + b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n\x00\xff junk\r\n\r\n"
    ],
    "te gzip": [POST_HEAD + b"Transfer-Encoding: gzip\r\n\r\nabc"],
    "cl + te": [POST_HEAD + b"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"],
    "two cls": [POST_HEAD + b"Content-Length: 3\r\nContent-Length: 4\r\n\r\nabcd"],
    "cl letters": [POST_HEAD + b"Content-Length: 1x\r\n\r\nab"],
    "cl negative": [POST_HEAD + b"Content-Length: -1\r\n\r\nab"],
    "cl huge": [POST_HEAD + b"Content-Length: " + b"9" * 30 + b"\r\n\r\nab"],
    "cl short body": [POST_HEAD + b"Content-Length: 100\r\n\r\n" + BODY],
    "cl long body": [POST_HEAD + b"Content-Length: 3\r\n\r\n" + BODY],
    "expect + junk": [POST_HEAD + b"Expect: 100-continue\r\nContent-Length: 5\r\n\r\n\xff\xfe"],
    # pipelining
    "pipelined junk": [GET + b"\x00\x01\x02 junk \r\n\r\n"],
    "pipelined partial": [GET + GET + b"GET /heal"],
    "pipelined many": [GET * 50],
    "pipelined post + junk": [POST_HEAD + b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY + b"@"],
    # sizes
    "huge header": [GET[:-2] + b"X-Big: " + b"a" * 100_000 + b"\r\n\r\n"],
    "many headers": [GET[:-2] + b"".join(b"X-%d: v\r\n" % i for i in range(2000)) + b"\r\n"],
    "huge target": [b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"],
    "huge line no end": [b"GET /" + b"a" * 300_000],
    # versions, methods, line ends, odd bytes
    "http/1.0": [b"GET /health HTTP/1.0\r\n\r\n"],
    "http/0.9": [b"GET /\r\n"],
    "http/2.0 line": [b"GET / HTTP/2.0\r\nHost: x\r\n\r\n"],
    "http/9.9": [b"GET / HTTP/9.9\r\nHost: x\r\n\r\n"],
    "connect": [b"CONNECT x:443 HTTP/1.1\r\nHost: x:443\r\n\r\nabc"],
    "options *": [b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n"],
    "absolute form": [b"GET http://evil/health HTTP/1.1\r\nHost: x\r\n\r\n"],
    "head method": [b"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n"],
    "bare lf": [b"GET /health HTTP/1.1\nHost: x\n\n"],
    "bare cr": [b"GET /health HTTP/1.1\rHost: x\r\r"],
    "obs-fold": [b"GET /health HTTP/1.1\r\nHost: x\r\nX: a\r\n b\r\n\r\n"],
    "nul in header": [b"GET /health HTTP/1.1\r\nHost: x\r\nX: a\x00b\r\n\r\n"],
    "no host": [b"GET /health HTTP/1.1\r\n\r\n"],
    "two hosts": [b"GET /health HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n"],
    "high bytes": [bytes(range(128, 256)) * 4],
    "nul bytes": [bytes(1024)],
    "byte by byte": [bytes([b]) for b in GET],
}


def _random_cases(rng: random.Random) -> dict[str, list[bytes]]:
    valid = [
        GET,
        POST_HEAD + b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY,
        WS + WS_KEY + b"\r\n",
    ]
    cases: dict[str, list[bytes]] = {}
    for i in range(RANDOM_CASES // 2):
        cases[f"random {i}"] = [rng.randbytes(rng.randint(1, 4096))]
    for i in range(RANDOM_CASES - RANDOM_CASES // 2):
        data = bytearray(rng.choice(valid))
        for _ in range(rng.randint(1, 8)):
            at = rng.randrange(len(data))
            op = rng.randrange(3)
            if op == 0:
                data[at] = rng.randrange(256)
            elif op == 1:
                data[at:at] = rng.randbytes(rng.randint(1, 16))
            else:
                del data[at : at + rng.randint(1, 8)]
        cases[f"mutated {i}"] = [bytes(data) + rng.randbytes(rng.randint(0, 3))]
    return cases


async def _one(host: str, port: int, writes: list[bytes]) -> None:
    """Send ``writes`` on a fresh connection, then read until the server closes it or the
    time is up (a refusal, a reset: all fine; only the process's survival is judged)."""
    with trio.move_on_after(CONNECTION_S):
        try:
            stream = await trio.open_tcp_stream(host, port)
        except OSError:
            return
        async with stream:
            try:
                for chunk in writes:
                    await stream.send_all(chunk)
                    await trio.lowlevel.checkpoint()
                await stream.send_eof()
                while await stream.receive_some(65536):
                    pass
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass


async def _run(host: str, port: int, cases: dict[str, list[bytes]]) -> None:
    limit = trio.CapacityLimiter(PARALLEL)

    async def one(writes: list[bytes]) -> None:
        async with limit:
            await _one(host, port, writes)

    async with trio.open_nursery() as nursery:
        for writes in cases.values():
            nursery.start_soon(one, writes)


async def _healthy(host: str, port: int) -> bool:
    """Whether a fresh connection gets ``GET /health`` answered with a 200."""
    data = b""
    with trio.move_on_after(10):
        try:
            async with await trio.open_tcp_stream(host, port) as stream:
                await stream.send_all(GET[:-2] + b"Connection: close\r\n\r\n")
                while chunk := await stream.receive_some(65536):
                    data += chunk
        except (OSError, trio.BrokenResourceError):
            return False
    return data.startswith(b"HTTP/1.1 200 ")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def main() -> int:
    base, pid, log_path = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    seed = int(sys.argv[4]) if len(sys.argv) > 4 else random.randrange(1 << 30)
    host, _, port_text = base.removeprefix("http://").rpartition(":")
    port = int(port_text)
    cases = {**FIXED, **_random_cases(random.Random(seed))}
    size_before = log_path.stat().st_size
    print(f"fuzz: raw bytes against {base}: {len(cases)} connections, seed {seed}")
    failures: list[str] = []
    # the fixed cases one at a time first (the first to take the server down is named)
    for name, writes in FIXED.items():
        trio.run(_one, host, port, writes)
        if not trio.run(_healthy, host, port) or not _alive(pid):
            failures.append(f"the server (pid {pid}) stopped answering after {name!r}")
            break
    if not failures:
        trio.run(_run, host, port, cases)
        if not trio.run(_healthy, host, port) or not _alive(pid):
            failures.append(f"the server (pid {pid}) stopped answering after the random cases")
    grown = log_path.read_bytes()[size_before:]
    sent = len(FIXED) + len(cases)
    if b"Traceback" in grown:
        failures.append("the server logged a traceback")
    if len(grown) > LOG_BYTES_PER_CONNECTION * sent:
        failures.append(f"the log grew by {len(grown)} bytes for {sent} connections")
    for failure in failures:
        print(f"fuzz raw: {failure}")
    if failures:
        print(grown[-3000:].decode(errors="replace"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
