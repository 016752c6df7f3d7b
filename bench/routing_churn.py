"""Churn run of the KV index (issue 25's memory target): engines store and evict blocks for
many minutes, the gateway's lookups go on, and the index's memory must stay at its bound.

Four engines, each with an LRU cache of ``--capacity`` blocks (as a vLLM engine's block pool
evicts), serve an endless stream of multi-turn conversations; every stored and evicted block
reaches the index as the engine's ``BlockStored`` / ``BlockRemoved`` would (with the engine's
own block hashes), and every prompt is looked up first, as ``cache_aware`` does. A fifth,
event-less engine is indexed from the routed prompts (the fallback) and expired by age. Every
``--every`` seconds the run prints the blocks indexed and the memory the index holds
(``tracemalloc``'s traces of ``smg_trio/routing``'s own allocations); at the end it checks
that, once the index is full, the most memory it held in the last third of the run is no
more than in the first third (5 % slack: the dicts' tables resize in steps) and that no
engine ever held more blocks than its capacity.

    .venv/bin/python bench/routing_churn.py                # 10 minutes
    .venv/bin/python bench/routing_churn.py --seconds 60   # a quick look
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import tracemalloc
from collections import OrderedDict

from smg_trio.routing.blocks import block_keys
from smg_trio.routing.index import KvIndex

BLOCK = 16


class Engine:
    """An engine's prefix cache: an LRU of full blocks keyed by their parent and tokens."""

    def __init__(self, name: str, capacity: int, index: KvIndex) -> None:
        self.key = (name, 0)
        self.capacity = capacity
        self.index = index
        self.lru: OrderedDict[int, tuple[int | None, tuple[int, ...]]] = OrderedDict()
        self.by_block: dict[tuple[int | None, tuple[int, ...]], int] = {}
        self.next_hash = 1
        index.add_engine(self.key, block_size=BLOCK, num_gpu_blocks=capacity)

    def prefill(self, prompt: list[int]) -> None:
        parent: int | None = None
        new_hashes: list[int] = []
        new_tokens: list[int] = []
        first_parent: int | None = None
        for i in range(len(prompt) // BLOCK):
            block = (parent, tuple(prompt[i * BLOCK : (i + 1) * BLOCK]))
            h = self.by_block.get(block)
            if h is not None:
                self.lru.move_to_end(h)
                parent = h
                continue
            h = self.next_hash
            self.next_hash += 1
            self.by_block[block] = h
            if not new_hashes:
                first_parent = parent
            new_hashes.append(h)
            new_tokens.extend(block[1])
            self.lru[h] = block
            parent = h
        if new_hashes:
            self.index.stored(self.key, new_hashes, first_parent, new_tokens, BLOCK)
        evicted = []
        while len(self.lru) > self.capacity:
            h, block = self.lru.popitem(last=False)
            del self.by_block[block]
            evicted.append(h)
        if evicted:
            self.index.removed(self.key, evicted)


def index_bytes() -> int:
    """What the index's own code allocated and still holds (``smg_trio/routing``)."""
    snap = tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.Filter(True, "*smg_trio/routing/*")]
    )
    return sum(stat.size for stat in snap.statistics("filename"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--every", type=float, default=10.0)
    ap.add_argument("--capacity", type=int, default=2000, help="blocks per engine")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    tracemalloc.start()
    index = KvIndex()
    engines = [Engine(f"e{i}", args.capacity, index) for i in range(4)]
    fallback = ("approx", 0)
    index.add_engine(fallback, block_size=BLOCK, num_gpu_blocks=args.capacity)
    system = [rng.randrange(1000, 2000) for _ in range(4 * BLOCK)]
    conversations: list[list[int]] = []
    samples: list[tuple[float, int, int]] = []
    over_capacity = 0
    start = time.monotonic()
    next_sample = start
    turns = 0
    while (now := time.monotonic()) - start < args.seconds:
        if not conversations or rng.random() < 0.2 or len(conversations) > 256:
            if len(conversations) > 256:
                conversations.pop(rng.randrange(len(conversations)))
            conversations.append(system + [rng.randrange(2000, 30000) for _ in range(96)])
        conv = rng.choice(conversations)
        conv.extend(rng.randrange(2000, 30000) for _ in range(rng.randrange(8, 64)))
        if len(conv) > 4096:
            conversations.remove(conv)
            continue
        keys = block_keys(conv, BLOCK)
        index.match(keys)
        engines[turns % len(engines)].prefill(conv)
        index.record(fallback, keys, now)
        index.note_prompt(keys)
        if turns % 500 == 0:
            index.expire(now - 30.0)
        turns += 1
        for e in (*engines, fallback):
            key = e.key if isinstance(e, Engine) else e
            if index.blocks(key) > index.capacity(key):
                over_capacity += 1
        if now >= next_sample:
            traced = index_bytes()
            samples.append((now - start, len(index), traced))
            print(
                f"{now - start:7.1f} s  turns {turns:8d}  blocks {len(index):7d}  "
                f"index memory {traced / 2**20:7.2f} MiB",
                flush=True,
            )
            next_sample += args.every
    total = args.capacity * (len(engines) + 1)
    filled = [i for i, (_, blocks, _) in enumerate(samples) if blocks >= 0.95 * total]
    if not filled:
        print(f"the index never filled ({samples[-1][1]} of {total} blocks): run longer")
        return 1
    full = [m for _, _, m in samples[filled[0] :]]
    third = max(1, len(full) // 3)
    early, late = max(full[:third]), max(full[-third:])
    ok = late <= early * 1.05 and over_capacity == 0
    print(
        f"turns {turns}; index memory once full: {min(full) / 2**20:.2f}-"
        f"{max(full) / 2**20:.2f} MiB; most in the first third {early / 2**20:.2f} MiB, in the "
        f"last third {late / 2**20:.2f} MiB; engines over capacity: {over_capacity}; "
        f"{'within the bound' if ok else 'GREW past the bound'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
