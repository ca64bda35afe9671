"""Active health checks eject a dead worker and bring it back."""

from __future__ import annotations

import asyncio

import aiohttp

from hybrid_pd.proxy.health import check_once
from tests.proxy.fakes import cluster, metric_value, run


def test_eject_after_failures_and_readmit():
    async def body():
        async with cluster(n_decode=2, health_failures=2, health_successes=2) as c:
            bad = c.decode[0]
            worker = c.state.pool.all("decode")[0]
            bad.healthy = False
            await check_once(c.state)
            assert worker.healthy  # one failure is not enough
            await check_once(c.state)
            assert not worker.healthy
            m = c.state.metrics.render().decode()
            assert metric_value(m, "hybrid_pd_proxy_worker_healthy", worker=bad.url) == 0
            async with aiohttp.ClientSession() as s:
                for _ in range(3):
                    async with s.post(c.url + "/v1/completions", json={"prompt": "x"}) as r:
                        assert r.status == 200
            assert bad.generate_calls == [] and len(c.decode[1].generate_calls) == 3
            bad.healthy = True
            await check_once(c.state)
            assert not worker.healthy  # needs two successes
            await check_once(c.state)
            assert worker.healthy
            await bad.stop()  # a dead process fails its checks too
            await check_once(c.state)
            await check_once(c.state)
            assert not worker.healthy
    run(body())


def test_health_loop_runs_in_the_background():
    async def body():
        async with cluster(health_interval=0.02, health_failures=1) as c:
            c.d.healthy = False
            worker = c.state.pool.all("decode")[0]
            while worker.healthy:
                await asyncio.sleep(0.01)
            async with aiohttp.ClientSession() as s:
                async with s.post(c.url + "/v1/completions", json={"prompt": "x"}) as r:
                    assert r.status == 503
                c.d.healthy = True
                while not worker.healthy:
                    await asyncio.sleep(0.01)
                async with s.post(c.url + "/v1/completions", json={"prompt": "x"}) as r:
                    assert r.status == 200
    run(body())
