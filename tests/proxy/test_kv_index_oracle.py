"""The fleet index answers as the per-worker index it replaced (kv_index_oracle.py) on random event streams:
stores, removals, clears, other tiers, restarts, retire/revive with and without the grace period, int-hash
workers, several group layouts, and sweeps of dead slots forced early."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hybrid_pd.proxy.kv.block_hash import as_int_hash, chained_block_hashes
from hybrid_pd.proxy.kv.block_map import holders
from hybrid_pd.proxy.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from hybrid_pd.proxy.kv.index import KVIndex
from hybrid_pd.proxy.kv.prompt_keys import PromptKeys
from tests.proxy.kv_index_oracle import KVIndex as OracleIndex

H = 4
BASE = list(range(1000, 1040))
PROMPTS = [BASE, BASE[:12] + list(range(2000, 2028)), BASE[:24] + list(range(3000, 3016)), list(range(4000, 4040))]
HASHES = [chained_block_hashes(p, H) for p in PROMPTS]  # 10 hashes each, shared prefixes of 3 and 6 blocks
LAYOUTS = [
    {0: ("full_attention", 4), 1: ("mamba", 8)},
    {0: ("mamba", 8), 1: ("full_attention", 8), 2: ("mamba", 8)},
    {0: ("full_attention", 4)},
    {0: ("full_attention", 4), 1: ("full_attention", 4), 2: ("mamba", 16), 3: ("sliding_window", 4)},
]
URLS = [f"http://w{i}:1" for i in range(5)]
INT_WORKERS = {URLS[3]}  # publishes VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES ints


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def published(url: str, group_size: int, prompt: int, blocks: list[int]) -> list[bytes | int]:
    """The hashes a group of `group_size` tokens publishes for the given blocks of a prompt."""
    k = group_size // H
    out = [HASHES[prompt][(b + 1) * k - 1] for b in blocks if (b + 1) * k - 1 < len(HASHES[prompt])]
    return [as_int_hash(h) for h in out] if url in INT_WORKERS else list(out)


blocks = st.one_of(st.integers(0, 10).map(lambda m: list(range(m))),  # a prefix, as an engine stores a prompt
                   st.lists(st.integers(0, 9), max_size=10))
store = st.tuples(st.just("store"), st.integers(0, 4), st.integers(0, 3), st.integers(0, 3), blocks,
                  st.sampled_from(["GPU", "GPU", None, "CPU"]))
# one engine step over a prompt: every group stores (a group may miss it, Mamba keeps some checkpoints only)
turn = st.tuples(st.just("turn"), st.integers(0, 4), st.integers(0, 3), st.integers(0, 40),
                 st.sets(st.integers(0, 3), max_size=2), st.lists(st.integers(0, 9), max_size=4))
op = st.one_of(
    turn, turn, turn, store, store,
    st.tuples(st.just("remove"), st.integers(0, 4), st.integers(0, 3), st.integers(0, 3),
              st.lists(st.integers(0, 9), max_size=4), st.sampled_from(["GPU", "CPU"])),
    st.tuples(st.just("clear"), st.integers(0, 4)),
    st.tuples(st.just("drop"), st.integers(0, 4)),
    st.tuples(st.just("retire"), st.integers(0, 4), st.sampled_from(["pod-a", "pod-b", None])),
    st.tuples(st.just("revive"), st.integers(0, 4), st.sampled_from(["pod-a", "pod-b", None])),
    st.tuples(st.just("wait"), st.sampled_from([1.0, 30.0, 61.0])),
)


def apply(idx, layout, step) -> None:
    kind = step[0]
    if kind in ("store", "remove"):
        _, w, group, prompt, blocks, medium = step
        group %= len(layout)
        spec_kind, size = layout[group]
        hashes = published(URLS[w], size, prompt, blocks)
        ev = (BlockStored(hashes, None, [], size, medium=medium, group_idx=group, kv_cache_spec_kind=spec_kind)
              if kind == "store" else BlockRemoved(hashes, medium, group_idx=group))
        idx.apply(URLS[w], KVEventBatch(0, [ev]))
    elif kind == "turn":
        _, w, prompt, tokens, missed, checkpoints = step
        events = []
        for group, (spec_kind, size) in layout.items():
            full = range(tokens // size)
            kept = [b for b in checkpoints if b in full] if spec_kind == "mamba" else list(full)
            if group not in missed:
                events.append(BlockStored(published(URLS[w], size, prompt, kept), None, [], size, medium="GPU",
                                          group_idx=group, kv_cache_spec_kind=spec_kind))
        idx.apply(URLS[w], KVEventBatch(0, events))
    elif kind == "clear":
        idx.apply(URLS[step[1]], KVEventBatch(0, [AllBlocksCleared()]))
    elif kind == "drop":
        idx.drop(URLS[step[1]])
    elif kind == "retire":
        idx.retire(URLS[step[1]], step[2])
    elif kind == "revive":
        idx.revive(URLS[step[1]], step[2])
    else:
        idx.clock.now += step[1]


def assert_same_answers(old: OracleIndex, new: KVIndex, configured: int) -> None:
    assert set(old.workers) == set(new.workers) and set(old.retired) == set(new.retired)
    assert {g: (s.kind, s.block_size) for g, s in old.specs.items()} == \
        {g: (s.kind, s.block_size) for g, s in new.specs.items()}
    for tokens in PROMPTS:
        for n in (len(tokens), len(tokens) - 1, 17, 9, 1):
            def hashes_for(h: int, tokens=tokens, n=n) -> list[bytes]:
                return chained_block_hashes(tokens[:n], h)

            expected = {url: old.hit_tokens(url, n, hashes_for, configured) for url in old.workers}
            assert new.hits(n, lambda h, tokens=tokens, n=n: PromptKeys(tokens[:n], h), configured) == expected
            assert {url: new.hit_tokens(url, n, hashes_for, configured) for url in new.workers} == expected


@settings(max_examples=300, deadline=None)
@given(layout=st.sampled_from(LAYOUTS), steps=st.lists(op, min_size=5, max_size=60), sweep_early=st.booleans(),
       configured=st.sampled_from([0, 0, H]))
def test_same_hits_as_the_per_worker_index(layout, steps, sweep_early, configured):
    old = OracleIndex(clock=Clock())
    new = KVIndex(clock=Clock(), sweep_min_entries=0 if sweep_early else 1 << 16, sweep_step_keys=1)
    for step in steps:
        apply(old, layout, step)
        apply(new, layout, step)
        assert_same_answers(old, new, configured)
    assert new.entries() == sum(len(hs) for w in new.workers for hs in new.held(w).values()) + sum(
        new.slots.entries[r.index.slot] for r in new.retired.values())
    new.slots.sweep()  # what is left of a sweep, in one go: the maps then hold only live and retired slots' bits
    live = {w.slot for w in new.workers.values()} | {r.index.slot for r in new.retired.values()}
    assert all(holders(v) >> s & 1 == 0 for m in new.maps.values() for v in m.blocks.values()
               for s in range(len(new.slots.entries)) if s not in live)
    assert_same_answers(old, new, configured)


def test_a_sweep_runs_in_steps_with_the_events_then_frees_the_slot():
    new = KVIndex(sweep_min_entries=0, sweep_step_keys=1)
    store = [BlockStored(HASHES[0][:4], None, [], 4, medium="GPU", group_idx=0)]
    new.apply(URLS[0], KVEventBatch(0, store))
    new.apply(URLS[1], KVEventBatch(0, [BlockStored(HASHES[0][:2], None, [], 4, medium="GPU", group_idx=0)]))
    slot = new.workers[URLS[0]].slot
    new.drop(URLS[0])  # 4 dead entries > 2 live ones: a sweep starts
    assert len(new.maps[0].blocks) == 4 and new.entries() == 2
    new.apply(URLS[1], KVEventBatch(0, []))  # no event: one key per step here, the last stored (URLS[0]'s alone)
    assert len(new.maps[0].blocks) == 3
    new.apply(URLS[1], KVEventBatch(0, store))  # 1 event: 32 keys, the rest of the sweep
    assert len(new.maps[0].blocks) == 4 and new.entries() == 4  # now every block is URLS[1]'s
    assert new.of(URLS[2]).slot == slot  # swept, hence reused
