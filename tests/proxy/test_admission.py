"""The bounded queue (proxy/admission.py): a freed slot goes to the oldest waiter, a waiter cancelled as its slot
arrives passes it on, a full queue and a long wait are 429s, and the gauges follow."""

from __future__ import annotations

import asyncio

import pytest

from hybrid_pd.proxy.admission import Admission
from hybrid_pd.proxy.config import AdmissionConfig
from hybrid_pd.proxy.errors import Overloaded
from hybrid_pd.proxy.metrics import ProxyMetrics
from tests.proxy.fakes import metric_value, run


def admission(**cfg) -> tuple[Admission, ProxyMetrics]:
    metrics = ProxyMetrics()
    return Admission(AdmissionConfig(**cfg), metrics), metrics


async def hold(a: Admission, name: str, order: list[str], release: asyncio.Event) -> None:
    async with a.slot():
        order.append(name)
        await release.wait()


def test_freed_slots_go_to_waiters_in_arrival_order_and_a_full_queue_is_refused():
    async def body():
        a, metrics = admission(max_in_flight=1, max_queue=2, queue_timeout_s=5)
        order: list[str] = []
        releases = {n: asyncio.Event() for n in "abc"}
        tasks = []
        for n in "abc":
            tasks.append(asyncio.create_task(hold(a, n, order, releases[n])))
            await asyncio.sleep(0)
        assert (order, a.active, a.waiting) == (["a"], 1, 2)
        text = metrics.render().decode()
        assert metric_value(text, "hybrid_pd_proxy_in_flight") == 1
        assert metric_value(text, "hybrid_pd_proxy_queued") == 2
        with pytest.raises(Overloaded):
            async with a.slot():
                pass
        for n in "abc":
            releases[n].set()
            await asyncio.sleep(0)
            await asyncio.sleep(0)
        await asyncio.gather(*tasks)
        assert (order, a.active, a.waiting) == (["a", "b", "c"], 0, 0)
    run(body())


def test_a_waiter_cancelled_as_its_slot_arrives_passes_the_slot_on():
    async def body():
        a, _ = admission(max_in_flight=1, max_queue=2, queue_timeout_s=5)
        order: list[str] = []
        release = {n: asyncio.Event() for n in "bc"}
        mine = a.slot()
        await mine.__aenter__()
        second = asyncio.create_task(hold(a, "b", order, release["b"]))
        third = asyncio.create_task(hold(a, "c", order, release["c"]))
        await asyncio.sleep(0)
        assert a.waiting == 2
        await mine.__aexit__(None, None, None)  # hands the slot to "b" without yielding: "b" has not run yet
        second.cancel()
        release["c"].set()
        await third
        with pytest.raises(asyncio.CancelledError):
            await second
        assert (order, a.active, a.waiting) == (["c"], 0, 0)
    run(body())


def test_a_wait_longer_than_the_queue_timeout_is_refused():
    async def body():
        a, _ = admission(max_in_flight=1, max_queue=1, queue_timeout_s=0.05)
        release = asyncio.Event()
        first = asyncio.create_task(hold(a, "a", [], release))
        await asyncio.sleep(0)
        with pytest.raises(Overloaded, match="no slot freed"):
            async with a.slot():
                pass
        assert (a.active, a.waiting) == (1, 0)
        release.set()
        await first
        assert a.active == 0
    run(body())
