"""The test oracle of proxy/kv/index.py: the proxy's earlier index, kept as it was (per worker, Python sets of
block hashes per group; a worker's usable hit walks the prompt's blocks on that worker alone). Simple enough to
trust, too slow and too big for a fleet; test_kv_index_oracle.py checks the fleet index answers as it does, and
benchmarks/kv_index_bench.py measures both.

What each worker holds in its prefix cache, per KV-cache group, learned from its KV events; and the usable
hybrid hit of a prompt on it.

A hybrid model has attention groups and Mamba groups. In align mode a Mamba group caches a state only at
some block boundaries (a checkpoint), and a prefix hit of N tokens needs BOTH every attention block below N
AND a checkpoint at exactly N in every Mamba group:

    prompt hashes  h1   h2   h3   h4   h5        (chained; h_i fingerprints tokens [0, i*B))
    attention      h1   h2   h3   h4   --        contiguous prefix: 4 blocks
    mamba          --   h2   --   --   --        checkpoints at 2 blocks only (h4 evicted or never kept)
    usable hit     2 blocks = 2*B tokens         (the attention prefix alone would claim 4)

The groups' kinds and block sizes are learned from every worker's events (one model per deployment), so a
Mamba group a worker never stored into still blocks its hits. Groups of other kinds (sliding window, ...)
do not limit the hit: the scorer is an estimate for routing,
never a promise. vLLM always computes a prompt's last token, so a hit is at most len(prompt) - 1 tokens.
Only the GPU (device) tier counts; offload tiers (medium CPU/STORAGE) are not where the engine hits first.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from hybrid_pd.connector.contract import DEFAULT_NONE_HASH_SEED, LAUNCHER_HASH_SEED
from hybrid_pd.proxy.config.sections import same_engine
from hybrid_pd.proxy.kv.block_hash import as_int_hash
from hybrid_pd.proxy.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from hybrid_pd.proxy.kv.hash_check import hash_granularity

ATTENTION_KINDS = frozenset({"full_attention", "mla_attention", "sink_full_attention"})
MAMBA_KIND = "mamba"
DEVICE_MEDIA = frozenset({None, "GPU"})
log = logging.getLogger("hybrid_pd.proxy")


@dataclass
class EventGroup:
    """A KV-cache group as the workers' KV events describe it (vLLM's spec kind names: full_attention, mamba,
    ...). The connector's plan.GroupSpec is its own view of a group (attention or mamba)."""

    kind: str
    block_size: int


@dataclass
class WorkerKVIndex:
    """The block hashes one worker has announced, per KV-cache group."""

    hashes: dict[int, set[bytes | int]] = field(default_factory=dict)  # group_idx -> stored block hashes
    int_hashes: bool = False  # the worker publishes 64-bit ints instead of sha256 bytes
    last_seq: int = -1
    gaps: int = 0  # batches missed (sequence jumps); the index may then overestimate until eviction events

    def apply(self, batch: KVEventBatch, specs: dict[int, EventGroup]) -> None:
        """Apply one batch; learns each group's kind and block size into `specs` (shared by all workers)."""
        for ev in batch.events:
            if isinstance(ev, BlockStored):
                if ev.medium not in DEVICE_MEDIA:
                    continue
                gid = ev.group_idx or 0
                spec = specs.get(gid)
                if spec is None or (ev.kv_cache_spec_kind and spec.kind != ev.kv_cache_spec_kind):
                    # learned even from an empty store: align mode announces a Mamba group with no checkpoint
                    # kept on a prompt's first pass, and that group must still block attention-only "hits"
                    specs[gid] = EventGroup(ev.kv_cache_spec_kind or "full_attention", ev.block_size)
                if not ev.block_hashes:
                    continue
                self.int_hashes = isinstance(ev.block_hashes[0], int)
                self.hashes.setdefault(gid, set()).update(ev.block_hashes)
            elif isinstance(ev, BlockRemoved):
                if ev.medium not in DEVICE_MEDIA:
                    continue
                self.hashes.get(ev.group_idx or 0, set()).difference_update(ev.block_hashes)
            elif isinstance(ev, AllBlocksCleared):
                for hashes in self.hashes.values():
                    hashes.clear()

    def note_seq(self, seq: int) -> None:
        if self.last_seq >= 0 and seq > self.last_seq + 1:
            self.gaps += seq - self.last_seq - 1
        self.last_seq = seq


def hash_block_size(specs: dict[int, EventGroup], configured: int = 0) -> int:
    """vLLM's default hash_block_size is the gcd of the groups' block sizes (prefix_match_unit unset)."""
    if configured:
        return configured
    sizes = [g.block_size for g in specs.values() if g.block_size > 0]
    return math.gcd(*sizes) if sizes else 0


def aligned_block(specs: dict[int, EventGroup]) -> int:
    """Tokens per aligned block (the lcm of the groups' block sizes; 0 while no event told them): the unit of
    every hybrid hit, and the least a remote prefill should move."""
    sizes = [g.block_size for g in specs.values() if g.kind in ATTENTION_KINDS or g.kind == MAMBA_KIND]
    return math.lcm(*sizes) if sizes else 0


def usable_hit_tokens(
    worker: WorkerKVIndex,
    specs: dict[int, EventGroup],
    num_tokens: int,
    hashes_for: Callable[[int], list[bytes]],
    configured_hash_block_size: int = 0,
) -> int:
    """Longest prefix (tokens) of a `num_tokens` prompt that `worker` can serve from its cache with both
    attention blocks and a Mamba checkpoint in every group. `specs` are the groups learned from every
    worker (one model per deployment): a Mamba group a worker never stored into still blocks its hits.
    `hashes_for(h)` gives the prompt's chained hashes at granularity h (cached by the caller)."""
    attention = {gid: g for gid, g in specs.items() if g.kind in ATTENTION_KINDS}
    mamba = {gid: g for gid, g in specs.items() if g.kind == MAMBA_KIND}
    h = hash_block_size(specs, configured_hash_block_size)
    if h <= 0 or not (attention or mamba):
        return 0
    raw = hashes_for(h)
    keys = [as_int_hash(x) for x in raw] if worker.int_hashes else raw
    empty: set[bytes | int] = set()
    limit = min(num_tokens - 1, len(keys) * h)  # vLLM computes the last prompt token itself
    for gid, g in attention.items():
        stored, k, blocks = worker.hashes.get(gid, empty), g.block_size // h, 0
        while (blocks + 1) * g.block_size <= limit and keys[(blocks + 1) * k - 1] in stored:
            blocks += 1
        limit = min(limit, blocks * g.block_size)
    if not mamba:
        return max(limit, 0)
    step = aligned_block(specs)
    n = (max(limit, 0) // step) * step
    while n > 0:
        if all(keys[n // h - 1] in worker.hashes.get(gid, empty) for gid in mamba):
            return n
        n -= step
    return 0


@dataclass
class Retired:
    index: WorkerKVIndex
    identity: str | None
    since: float


class KVIndex:
    """Per-worker indexes keyed by worker URL, the KV-cache groups learned from all of them, and whether the
    proxy's hashing reproduces theirs (hash_check.py).

    A worker that leaves the pool (a readiness blip drops it from Kubernetes' ready endpoints) keeps its index
    for `grace_s` seconds: the same worker back within it (same URL, and the same engine identity where known)
    gets it again, with the KV events it missed counted as a gap; after it, or for another engine, it starts
    empty. (vLLM's replay socket could fill the gap, but our launchers do not open one: kv_subscriber.py.)"""

    def __init__(
        self,
        algo: str = "sha256",
        seed: str = "vllm-none-hash",
        grace_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.workers: dict[str, WorkerKVIndex] = {}
        self.retired: dict[str, Retired] = {}
        self.grace_s, self.clock = grace_s, clock
        self.specs: dict[int, EventGroup] = {}
        self.algo, self.seed = algo, seed
        # with the default seed, the workers may be on a vLLM < 0.27 started by our launchers: try theirs too
        self.candidate_seeds = [seed] + ([LAUNCHER_HASH_SEED] if seed == DEFAULT_NONE_HASH_SEED else [])
        self.hashes_verified: bool | None = None  # None: no event could tell yet
        self.detected_hash_block_size = 0

    def of(self, url: str) -> WorkerKVIndex:
        idx = self.workers.get(url)
        if idx is None:
            idx = self.workers[url] = WorkerKVIndex()
        return idx

    def apply(self, url: str, batch: KVEventBatch) -> None:
        if not self.hashes_verified:
            self._verify(url, batch)
        self.of(url).apply(batch, self.specs)

    def _verify(self, url: str, batch: KVEventBatch) -> None:
        for ev in batch.events:
            if not isinstance(ev, BlockStored) or ev.medium not in DEVICE_MEDIA:
                continue
            g, seed = None, self.seed
            for seed in self.candidate_seeds:
                g = hash_granularity(ev, self.algo, seed)
                if g is not None:  # CANNOT_TELL (0) included: this event cannot rule the seed out
                    break
            if g is None:
                if self.hashes_verified is None:
                    log.warning(
                        "KV events of %s carry block hashes this proxy cannot reproduce with "
                        "--kv-hash-algo %s --kv-hash-seed %r: kv_hit routing will find no hits; set them "
                        "to the workers' --prefix-caching-hash-algo and PYTHONHASHSEED",
                        url,
                        self.algo,
                        self.seed,
                    )
                self.hashes_verified = False
                return
            if g:
                if seed != self.seed:
                    log.info(
                        "KV events of %s: the workers' PYTHONHASHSEED is %r (set by hybrid-pd's launchers on "
                        "vLLM < 0.27); hashing prompts with it",
                        url,
                        seed,
                    )
                    self.seed = seed
                self.hashes_verified, self.detected_hash_block_size = True, g
                return

    def drop(self, url: str) -> None:
        self.workers.pop(url, None)

    def retire(self, url: str, identity: str | None) -> None:
        """The worker left the pool: keep its index for grace_s seconds."""
        self._expire()
        index = self.workers.pop(url, None)
        if index is not None and self.grace_s > 0:
            self.retired[url] = Retired(index, identity, self.clock())

    def revive(self, url: str, identity: str | None) -> bool:
        """The worker (re)joined the pool: give it back its index if it left within grace_s seconds and is
        the same engine; True when it did."""
        self._expire()
        old = self.retired.pop(url, None)
        if old is None or not same_engine(old.identity, identity):
            return False
        self.workers[url] = old.index
        return True

    def _expire(self) -> None:
        horizon = self.clock() - self.grace_s
        for url in [u for u, r in self.retired.items() if r.since < horizon]:
            del self.retired[url]

    def hit_tokens(
        self, url: str, num_tokens: int, hashes_for: Callable[[int], list[bytes]], configured_hash_block_size: int = 0
    ) -> int:
        worker = self.workers.get(url)
        if worker is None or num_tokens < 2:
            return 0
        return usable_hit_tokens(
            worker, self.specs, num_tokens, hashes_for, configured_hash_block_size or self.detected_hash_block_size
        )
