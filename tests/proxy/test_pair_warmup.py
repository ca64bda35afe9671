"""--warm-pairs (proxy/pair_warmup.py): each admitted (P, D) pair gets one PD request of the proxy's own before the
proxy is ready, again after either worker was ejected and came back; a failed warm-up only logs."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from hybrid_pd.proxy.pair_warmup import warm_pairs
from tests.proxy.fakes import cluster, run


async def health(url: str) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as s, s.get(url + "/health") as r:
        return r.status, await r.json()


async def until(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_every_pair_is_warmed_once_before_the_proxy_is_ready():
    async def body():
        async with cluster(n_prefill=2, n_decode=1, warm_pairs=True) as c:
            for p in c.prefill:
                p.hang = True  # P holds the warm-up: the proxy is not ready meanwhile
            await until(lambda: any(p.generate_calls for p in c.prefill))
            status, said = await health(c.proxy.url)
            assert status == 503 and said["status"] == "warming the PD pairs"
            for p in c.prefill:
                p.hang = False
                p.release.set()
            await until(lambda: len(c.d.generate_calls) == 2)
            await until(lambda: c.state.pairs_warming_until == 0.0)
            assert (await health(c.proxy.url))[0] == 200
            for p in c.prefill:
                (call,) = p.generate_calls
                assert call.body["kv_transfer_params"] == {"do_remote_decode": True} and call.body["max_tokens"] == 1
                assert len(call.body["prompt"].split()) >= 1200
            for call in c.d.generate_calls:  # P's answer, handed on as a client's turn would be
                assert call.body["kv_transfer_params"]["do_remote_prefill"] is True and call.body["max_tokens"] == 1
            await warm_pairs(c.state)  # another round: nothing new to warm
            assert sum(len(p.generate_calls) for p in c.prefill) == 2 and len(c.d.generate_calls) == 2

    run(body())


def test_a_worker_back_after_an_ejection_is_warmed_again_and_a_failure_only_logs(caplog):
    async def body():
        async with cluster(warm_pairs=True) as c:
            await until(lambda: len(c.d.generate_calls) == 1)
            await until(lambda: c.state.pairs_warming_until == 0.0)
            (p,) = c.state.pool.all("prefill")
            p.healthy = False  # ejected: the pair is forgotten
            c.p.status = 500
            await warm_pairs(c.state)
            assert not c.state.pairs_warmed
            p.healthy = True  # back, and its warm-up fails: logged, the proxy stays ready
            await warm_pairs(c.state)
            assert len(c.p.generate_calls) == 2 and len(c.d.generate_calls) == 1
            assert (await health(c.proxy.url))[0] == 200
            assert any("PD warm-up" in r.getMessage() and "failed" in r.getMessage() for r in caplog.records)

    run(body())


def test_off_by_default():
    async def body():
        async with cluster() as c:
            assert (await health(c.proxy.url))[0] == 200
            await asyncio.sleep(0.2)
            assert c.p.generate_calls == [] and c.d.generate_calls == []

    run(body())
