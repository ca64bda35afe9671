"""Proxy replicas agree on load: two real proxies in front of the same fake workers (tests/proxy/fakes.py, which
report their requests in flight on /metrics as vLLM does) each see the sum of both proxies' requests, and
route around a decoder that others filled. With --load-interval 0 (each proxy counts only its own requests,
as before) the same runs see 1/N: the negative control."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import aiohttp
import pytest

from hybrid_pd.proxy.app import RunningProxy, serve_in_background
from hybrid_pd.proxy.config import ProxyConfig
from hybrid_pd.proxy.engine_load import parse
from hybrid_pd.proxy.workers import EngineLoad
from tests.proxy.fakes import FakeWorker, metric_value, run

BODY = {"model": "fake-model", "prompt": "hello", "max_tokens": 2}


async def until(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    async def poll() -> None:
        while not check():
            await asyncio.sleep(0.01)
    await asyncio.wait_for(poll(), timeout_s)


@contextlib.asynccontextmanager
async def two_proxies(decoders: list[FakeWorker], load_interval: float) -> AsyncIterator[list[RunningProxy]]:
    for d in decoders:
        d.hang = True
        await d.start()
    config = ProxyConfig.from_flat({"port": 0, "decode": [d.url for d in decoders], "health_interval": 0,
                                    "load_interval": load_interval})
    try:
        async with serve_in_background(config) as a, serve_in_background(config) as b:
            yield [a, b]
    finally:
        for d in decoders:
            await d.stop()


def send(session: aiohttp.ClientSession, url: str, n: int) -> list[asyncio.Task]:
    return [asyncio.create_task(session.post(f"{url}/v1/completions", json=BODY)) for _ in range(n)]


@pytest.mark.parametrize("load_interval", [0.05, 0])
def test_two_proxies_each_see_both_proxies_streams_on_a_decoder(load_interval):
    async def body():
        d = FakeWorker("decode")
        async with two_proxies([d], load_interval) as (a, b), aiohttp.ClientSession() as s:
            tasks = send(s, a.url, 3) + send(s, b.url, 2)
            await until(lambda: d.running == 5)
            wa, wb = a.state.pool.all("decode")[0], b.state.pool.all("decode")[0]
            assert (wa.in_flight, wb.in_flight) == (3, 2)  # what each proxy sent
            if load_interval:
                await until(lambda: wa.load == 5 and wb.load == 5)  # what the decoder holds: the sum
                assert wa.engine == wb.engine == EngineLoad(running=5.0, waiting=0.0, kv_usage=0.0)
            else:
                await asyncio.sleep(0.2)
                assert (wa.load, wb.load) == (3, 2)  # 1/N each: what the proxies saw before
            d.release.set()
            for t in tasks:
                (await t).release()
            await until(lambda: d.running == 0 and wa.in_flight == wb.in_flight == 0)
            await until(lambda: wa.load == wb.load == 0)
    run(body())


@pytest.mark.parametrize("load_interval", [0.05, 0])
def test_a_proxy_routes_around_a_decoder_that_other_replicas_filled(load_interval):
    async def body():
        d1, d2 = FakeWorker("decode"), FakeWorker("decode")
        async with two_proxies([d1, d2], load_interval) as (_, b), aiohttp.ClientSession() as s:
            others = send(s, d1.url, 4)  # streams another replica (or client) started on d1
            await until(lambda: d1.running == 4)
            w1 = next(w for w in b.state.pool.all("decode") if w.url == d1.url)
            if load_interval:
                await until(lambda: w1.load == 4)
            mine: list[asyncio.Task] = []
            for n in (1, 2):  # one at a time: each decision sees the one before it
                mine += send(s, b.url, 1)
                await until(lambda n=n: d1.running + d2.running == 4 + n)
            assert (d1.running, d2.running) == ((4, 2) if load_interval else (5, 1))
            if load_interval:  # each worker's prompt tokens this proxy has in flight (KEDA's prefill input)
                async with s.get(f"{b.url}/metrics") as r:
                    text = await r.text()
                assert "hybrid_pd_proxy_worker_prompt_tokens{" in text
                assert metric_value(text, "hybrid_pd_proxy_worker_prompt_tokens", worker=d2.url) == 0
            for d in (d1, d2):
                d.release.set()
            for t in others + mine:
                (await t).release()
    run(body())


def test_the_load_is_read_from_vllms_exposition():
    text = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m a"} 3.0
vllm:num_requests_running{engine="1",model_name="m a"} 2.0
vllm:num_requests_waiting{engine="0",model_name="m a"} 4.0
vllm:kv_cache_usage_perc{engine="0",model_name="m a"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m a"} 0.5
vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 9.0
process_cpu_seconds_total 1.5
"""
    assert parse(text) == EngineLoad(running=5.0, waiting=4.0, kv_usage=0.5)
    assert parse("process_cpu_seconds_total 1.5\n") is None  # not an engine: the proxy's own count stays
    assert parse("vllm:num_requests_running 0\n") == EngineLoad(0.0, 0.0, None)
