"""A synthetic fleet for the KV-index benchmark: what every worker's KV events say, and probe prompts.

Hybrid layout: attention blocks of 16 tokens (group 0, also the hash block size) and a Mamba checkpoint every
256 tokens (group 1, blocks of 256). Every worker holds a shared 2k-token system prompt and 16-64 sessions of
8k tokens behind it (or, with `blocks_per_worker`, as many sessions as make that many attention blocks). A
session's blocks past the system prompt are its own. Most sessions carry random 32-byte hashes (the index
cannot tell them from sha256 digests, and drawing them is cheap); `real_sessions` of them are the chained
hashes of real token ids, so that a probe (one of them continued by 512 new tokens: 8.7k tokens) is hashed
by the router exactly as the workers hashed it. Event batches follow vLLM's shape: per 256-token span one
BlockStored of 16 attention hashes and one of the span's checkpoint.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from hybrid_pd.proxy.kv.block_hash import chained_block_hashes
from hybrid_pd.proxy.kv.events import BlockRemoved, BlockStored, KVEventBatch

VOCAB = 151_000
BLOCK = 16  # attention block = hash block size
CHECKPOINT = 256  # the Mamba group's block: one checkpoint per 256 tokens
SYSTEM = 2048  # shared system prompt
SESSION = 8192  # tokens per session, system prompt included
NEW = 512  # a probe's tokens past the session it continues
PER_SPAN = CHECKPOINT // BLOCK
EVENTS_PER_BATCH = 32


@dataclass
class Fleet:
    workers: int
    seed: int = 0
    blocks_per_worker: int = 0  # 0: 16-64 sessions of 8k tokens per worker
    real_sessions: int = 32
    system: list[int] = field(default_factory=list)
    system_hashes: list[bytes] = field(default_factory=list)
    probes: list[tuple[int, list[int]]] = field(default_factory=list)  # (worker holding it, probe token ids)
    real: dict[tuple[int, int], list[bytes]] = field(default_factory=dict)  # (worker, session) -> its hashes

    def __post_init__(self) -> None:
        rng = random.Random(self.seed)
        self.system = [rng.randrange(VOCAB) for _ in range(SYSTEM)]
        self.system_hashes = chained_block_hashes(self.system, BLOCK)
        for r in range(self.real_sessions):
            worker = r % self.workers
            tokens = self.system + [rng.randrange(VOCAB) for _ in range(SESSION - SYSTEM)]
            self.real[(worker, r // self.workers)] = chained_block_hashes(tokens, BLOCK)[SYSTEM // BLOCK :]
            self.probes.append((worker, tokens + [rng.randrange(VOCAB) for _ in range(NEW)]))

    def url(self, worker: int) -> str:
        return f"http://w{worker}:8000"

    def sessions(self, worker: int) -> int:
        if self.blocks_per_worker:
            return max(1, -(-(self.blocks_per_worker - SYSTEM // BLOCK) // ((SESSION - SYSTEM) // BLOCK)))
        return random.Random(f"{self.seed}:{worker}:n").randint(16, 64)

    def session_hashes(self, worker: int) -> Iterator[list[bytes]]:
        """Each session's own attention hashes (past the system prompt), in chain order."""
        rng = random.Random(f"{self.seed}:{worker}")
        own = (SESSION - SYSTEM) // BLOCK
        for s in range(self.sessions(worker)):
            yield self.real.get((worker, s)) or [rng.randbytes(32) for _ in range(own)]

    def batches(self, worker: int, remove: bool = False) -> Iterator[KVEventBatch]:
        """The worker's whole cache as vLLM announces it (or evicts it, with remove=True)."""
        system = [bytes(bytearray(h)) for h in self.system_hashes]  # each worker's events decode their own copies
        events: list = list(_span_events(system, remove))
        for hashes in self.session_hashes(worker):
            events += _span_events(hashes, remove)
            while len(events) >= EVENTS_PER_BATCH:
                yield KVEventBatch(0.0, events[:EVENTS_PER_BATCH])
                events = events[EVENTS_PER_BATCH:]
        if events:
            yield KVEventBatch(0.0, events)


def _span_events(hashes: list[bytes], remove: bool) -> Iterator[BlockStored | BlockRemoved]:
    for start in range(0, len(hashes), PER_SPAN):
        span = hashes[start : start + PER_SPAN]
        if remove:
            yield BlockRemoved(span, "GPU", group_idx=0)
            yield BlockRemoved(span[-1:], "GPU", group_idx=1)
        else:
            yield BlockStored(span, None, [], BLOCK, medium="GPU", group_idx=0, kv_cache_spec_kind="full_attention")
            yield BlockStored(span[-1:], None, [], CHECKPOINT, medium="GPU", group_idx=1, kv_cache_spec_kind="mamba")


def block_events(batch: KVEventBatch) -> int:
    """Block hashes a batch stores or removes (what 'block events' counts)."""
    return sum(len(getattr(ev, "block_hashes", ())) for ev in batch.events)
