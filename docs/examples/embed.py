"""Embed smg_trio in a trio program: start the gateway (and a mock engine) in a nursery, make
one chat request with httpx, print the reply, and shut everything down.

Run: ``python docs/examples/embed.py`` (needs ``httpx``: ``pip install -e '.[test]'``).
"""

from __future__ import annotations

import httpx
import trio

from smg_trio.mock.tiny_model import default_tiny_model_dir
from smg_trio.serve import EngineLaunchConfig, GatewayConfig, serve


async def main() -> None:
    model = str(default_tiny_model_dir())  # generated on first use; no downloads
    config = GatewayConfig(
        port=0,  # any free port; the handle says which
        served_model_name="mock-tiny",
        engines=EngineLaunchConfig(backend="mock", model=model),
    )
    async with trio.open_nursery() as nursery:
        handle = await nursery.start(serve, config)  # bound, engines registered
        async with httpx.AsyncClient(base_url=handle.base_url, timeout=30) as client:
            resp = await client.post(
                "/v1/chat/completions",
                json={
                    "model": "mock-tiny",
                    "messages": [{"role": "user", "content": "Say hello"}],
                    "max_tokens": 16,
                },
            )
            resp.raise_for_status()
            print(resp.json()["choices"][0]["message"]["content"])  # noqa: T201
        nursery.cancel_scope.cancel()  # stops the server, the worker and the engine group


if __name__ == "__main__":
    trio.run(main)
