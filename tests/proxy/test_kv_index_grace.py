"""A removed worker's KV index is kept for --kv-index-grace-s and given back to the same engine only."""

from __future__ import annotations

from hybrid_pd.proxy.kv.block_hash import block_key
from hybrid_pd.proxy.kv.events import BlockStored, KVEventBatch
from hybrid_pd.proxy.kv.index import KVIndex


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def store(kv: KVIndex, url: str, h: bytes) -> None:
    kv.apply(url, KVEventBatch(0, [BlockStored([h], None, [], 4, medium="GPU", group_idx=0)]))


def indexed(grace_s: float = 60.0) -> tuple[KVIndex, Clock]:
    clock = Clock()
    kv = KVIndex(grace_s=grace_s, clock=clock)
    store(kv, "http://a:1", b"h")
    return kv, clock


def test_the_same_worker_back_within_the_grace_period_gets_its_index():
    kv, clock = indexed()
    kept = kv.workers["http://a:1"]
    kv.retire("http://a:1", "pod-1")
    assert "http://a:1" not in kv.workers
    clock.now += 59
    assert kv.revive("http://a:1", "pod-1") and kv.workers["http://a:1"] is kept
    assert kv.held("http://a:1") == {0: {block_key(b"h")}}
    kv.retire("http://a:1", None)  # identity unknown (static workers): the URL decides
    assert kv.revive("http://a:1", None) and kv.workers["http://a:1"] is kept


def test_another_engine_or_a_late_return_starts_empty():
    kv, clock = indexed()
    kv.retire("http://a:1", "pod-1")
    assert not kv.revive("http://a:1", "pod-2") and "http://a:1" not in kv.workers
    store(kv, "http://a:1", b"h2")
    assert kv.held("http://a:1") == {0: {block_key(b"h2")}}  # the other engine's index starts empty
    kv.retire("http://a:1", "pod-2")
    clock.now += 61
    assert not kv.revive("http://a:1", "pod-2") and not kv.retired


def test_expired_indexes_are_dropped_as_others_come_and_go():
    kv, clock = indexed()
    kv.retire("http://a:1", None)
    clock.now += 61
    kv.of("http://b:1")
    kv.retire("http://b:1", None)
    assert list(kv.retired) == ["http://b:1"]


def test_no_grace_drops_at_once():
    kv, _ = indexed(grace_s=0)
    kv.retire("http://a:1", None)
    assert not kv.retired and not kv.revive("http://a:1", None)
