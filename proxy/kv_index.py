"""What each worker holds in its prefix cache, per KV-cache group, learned from its KV events; and the usable
hybrid hit of a prompt on it.

A hybrid model has attention groups and Mamba groups. In align mode a Mamba group caches a state only at
some block boundaries (a checkpoint), and a prefix hit of N tokens needs BOTH every attention block below N
AND a checkpoint at exactly N in every Mamba group:

    prompt hashes  h1   h2   h3   h4   h5        (chained; h_i fingerprints tokens [0, i*B))
    attention      h1   h2   h3   h4   --        contiguous prefix: 4 blocks
    mamba          --   h2   --   --   --        checkpoints at 2 blocks only (h4 evicted or never kept)
    usable hit     2 blocks = 2*B tokens         (the attention prefix alone would claim 4)

Groups of other kinds (sliding window, ...) do not limit the hit: the scorer is an estimate for routing,
never a promise. vLLM always computes a prompt's last token, so a hit is at most len(prompt) - 1 tokens.
Only the GPU (device) tier counts; offload tiers (medium CPU/STORAGE) are not where the engine hits first.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from .block_hash import as_int_hash
from .kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

ATTENTION_KINDS = frozenset({"full_attention", "mla_attention", "sink_full_attention"})
MAMBA_KIND = "mamba"
DEVICE_MEDIA = frozenset({None, "GPU"})


@dataclass
class GroupCache:
    kind: str
    block_size: int
    hashes: set[bytes | int] = field(default_factory=set)


@dataclass
class WorkerKVIndex:
    """The block hashes one worker has announced, per KV-cache group."""

    groups: dict[int, GroupCache] = field(default_factory=dict)
    int_hashes: bool = False  # the worker publishes 64-bit ints instead of sha256 bytes
    last_seq: int = -1
    gaps: int = 0  # batches missed (sequence jumps); the index may then overestimate until eviction events

    def apply(self, batch: KVEventBatch) -> None:
        for ev in batch.events:
            if isinstance(ev, BlockStored):
                if ev.medium not in DEVICE_MEDIA or not ev.block_hashes:
                    continue
                gid = ev.group_idx or 0
                group = self.groups.get(gid)
                if group is None:
                    group = self.groups[gid] = GroupCache(ev.kv_cache_spec_kind or "full_attention", ev.block_size)
                elif ev.kv_cache_spec_kind:
                    group.kind = ev.kv_cache_spec_kind
                self.int_hashes = isinstance(ev.block_hashes[0], int)
                group.hashes.update(ev.block_hashes)
            elif isinstance(ev, BlockRemoved):
                if ev.medium not in DEVICE_MEDIA:
                    continue
                group = self.groups.get(ev.group_idx or 0)
                if group is not None:
                    group.hashes.difference_update(ev.block_hashes)
            elif isinstance(ev, AllBlocksCleared):
                for group in self.groups.values():
                    group.hashes.clear()

    def note_seq(self, seq: int) -> None:
        if self.last_seq >= 0 and seq > self.last_seq + 1:
            self.gaps += seq - self.last_seq - 1
        self.last_seq = seq

    def hash_block_size(self, configured: int = 0) -> int:
        """vLLM's default hash_block_size is the gcd of the groups' block sizes (prefix_match_unit unset)."""
        if configured:
            return configured
        sizes = [g.block_size for g in self.groups.values() if g.block_size > 0]
        return math.gcd(*sizes) if sizes else 0

    def usable_hit_tokens(self, num_tokens: int, hashes_for: Callable[[int], list[bytes]],
                          configured_hash_block_size: int = 0) -> int:
        """Longest prefix (tokens) of a `num_tokens` prompt that this worker can serve from its cache with both
        attention blocks and a Mamba checkpoint. `hashes_for(h)` gives the prompt's chained hashes at
        granularity h (cached by the caller: several workers usually share h)."""
        attention = [g for g in self.groups.values() if g.kind in ATTENTION_KINDS and g.hashes]
        mamba = [g for g in self.groups.values() if g.kind == MAMBA_KIND]
        if not attention and not any(g.hashes for g in mamba):
            return 0
        h = self.hash_block_size(configured_hash_block_size)
        if h <= 0:
            return 0
        raw = hashes_for(h)
        keys = [as_int_hash(x) for x in raw] if self.int_hashes else raw
        limit = min(num_tokens - 1, len(keys) * h)  # vLLM computes the last prompt token itself
        for g in attention:
            k = g.block_size // h
            blocks = 0
            while (blocks + 1) * g.block_size <= limit and keys[(blocks + 1) * k - 1] in g.hashes:
                blocks += 1
            limit = min(limit, blocks * g.block_size)
        if not mamba:
            return max(limit, 0)
        step = math.lcm(*(g.block_size for g in attention + mamba))
        n = (max(limit, 0) // step) * step
        while n > 0:
            if all(keys[n // h - 1] in g.hashes for g in mamba):
                return n
            n -= step
        return 0


class KVIndex:
    """Per-worker indexes, keyed by worker URL."""

    def __init__(self) -> None:
        self.workers: dict[str, WorkerKVIndex] = {}

    def of(self, url: str) -> WorkerKVIndex:
        idx = self.workers.get(url)
        if idx is None:
            idx = self.workers[url] = WorkerKVIndex()
        return idx

    def drop(self, url: str) -> None:
        self.workers.pop(url, None)
