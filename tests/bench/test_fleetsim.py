"""The fleet simulator's parts that its figures rest on: align-mode caching and its events in the proxy's index,
the steps of a prefill, and a decode span cut by new work."""

from __future__ import annotations

from benchmarks.fleetsim_engine import Cache, Engine, Job, chunks_of
from benchmarks.fleetsim_model import CostModel
from proxy.kv.events import KVEventBatch
from proxy.kv.index import KVIndex
from proxy.kv.prompt_keys import PromptKeys

B = 544


def index_hit(index: KVIndex, url: str, keys: list[int], n: int) -> int:
    given = PromptKeys((), B)
    given.keys, given.total = keys, len(keys)
    return index.hits(n, lambda h: given, B)[url]


def test_hit_needs_a_checkpoint_and_the_index_agrees_after_evictions():
    index = KVIndex(grace_s=0)
    index.hashes_verified = True
    cache = Cache(capacity_pages=12, block=B, ckpt_pages=3, publish=lambda ev: index.apply("w", KVEventBatch(0, ev)))
    keys = list(range(100, 110))
    cache.store(keys, 6, [3])  # attention blocks 0-5, a checkpoint at 3 blocks only
    n = 10 * B
    assert cache.hit(keys, n) == 3 * B  # the attention prefix alone would claim 6 blocks
    assert index_hit(index, "w", keys, n) == 3 * B
    cache.store(list(range(200, 204)), 4, [4])  # 4 + 3 more pages: 16 > 12, the oldest go (keys 100-103...)
    assert cache.pages <= 12
    assert cache.hit(keys, n) == index_hit(index, "w", keys, n) == 0  # block 0 was evicted: no usable prefix


def test_align_mode_prefill_steps_end_on_boundaries_then_the_tail():
    assert chunks_of(0, 4858, B, 8192) == [(4352, 0), (506, 4352)]  # the two steps measured on the H100
    assert chunks_of(0, 20000, B, 8192) == [(8160, 0), (8160, 8160), (3264, 16320), (416, 19584)]
    assert chunks_of(3808, 4351, B, 8192) == [(543, 3808)]
    assert chunks_of(100, 100, B, 8192) == []


class Clock:
    def __init__(self) -> None:
        self.now, self.events = 0.0, []

    def at(self, t, fn, *args):
        self.events.append((t, fn, args))

    def run(self):
        while self.events:
            self.events.sort(key=lambda e: e[0])
            t, fn, args = self.events.pop(0)
            self.now = t
            fn(t, *args)


def test_new_work_cuts_a_decode_span_at_the_running_step():
    cost = CostModel(s0=0.05, s1=0, s2=0, d0=0.01, d1=0, read0=0, read_bw=1e12, bytes_per_block=0, p_hop=0,
                     read_poll=0, front=0, front_local=0, block=B)
    clock = Clock()
    engine = Engine("d", clock, cost, Cache(10**6, B, 3, None), 8192, 32)
    done: dict[str, float] = {}
    engine.submit(Job([(1, 0)], 100, None, lambda t: done.setdefault("long", t)))  # a 100-token stream
    clock.events.sort(key=lambda e: e[0])
    t, fn, args = clock.events.pop(0)  # its first (1-token) step
    clock.now = t
    fn(t, *args)
    clock.now = 0.0355  # mid-span: the running step ends at 0.04
    first: dict[str, float] = {}
    engine.submit(Job([(1000, 0)], 1, lambda t: first.setdefault("new", t), None))
    clock.run()
    assert abs(first["new"] - (0.04 + 0.05)) < 1e-9  # waits for the step under way, then one eager step
    assert abs(done["long"] - (0.01 * 99 + 0.05)) < 1e-9  # 99 decode steps and the eager one it shared
