"""The proxy in front of fake workers it discovers from a fake Kubernetes API (EndpointSlices, watched): it
follows a replaced pod, lets a terminating decoder finish its stream while it sends it nothing new, and keeps a
worker's KV index across a readiness blip (--kv-index-grace-s)."""

from __future__ import annotations

import asyncio

import aiohttp

from hybrid_pd.proxy.app import serve_in_background
from hybrid_pd.proxy.kv.block_hash import block_key
from hybrid_pd.proxy.kv.events import BlockStored, KVEventBatch
from tests.proxy.fake_k8s_api import FakeK8sAPI, endpoint, endpoint_slice
from tests.proxy.fakes import FakeWorker, run
from tests.proxy.test_discovery_k8s import proxy_config, until


def pd_config(url: str):
    return proxy_config(url, pd_policy="always-remote")  # these tests follow workers through PD turns


def slice_of(w: FakeWorker, name: str, **conditions) -> dict:
    host, port = w.url.removeprefix("http://").split(":")
    uid = conditions.pop("uid", None)
    return endpoint_slice(name, w.role, [endpoint(host, uid=uid or f"uid-{port}", **conditions)], http=int(port),
                          events=None)


def store(kv, url: str, h: bytes) -> None:
    kv.apply(url, KVEventBatch(0, [BlockStored([h], None, [], 4, medium="GPU", group_idx=0)]))


async def started(*workers: FakeWorker) -> None:
    for w in workers:
        await w.start()


async def complete(session: aiohttp.ClientSession, url: str, stream: bool = False) -> int:
    async with session.post(url + "/v1/completions", json={"prompt": "x", "stream": stream}) as r:
        await r.read()
        return r.status


def test_proxy_follows_a_replaced_decoder():
    async def body():
        api, d1, d2, p = FakeK8sAPI(), FakeWorker("decode"), FakeWorker("decode"), FakeWorker("prefill")
        await started(d1, d2, p)
        url = await api.start()
        api.put(slice_of(d1, "dec"))
        api.put(slice_of(p, "pre"))
        try:
            async with serve_in_background(pd_config(url)) as proxy, aiohttp.ClientSession() as s:
                pool = proxy.state.pool
                await until(lambda: [w.url for w in pool.all("decode")] == [d1.url] and pool.all("prefill"))
                assert await complete(s, proxy.url) == 200
                assert len(d1.generate_calls) == 1 and len(p.generate_calls) == 1
                api.put(slice_of(d2, "dec"))  # the decoder pod was replaced
                await until(lambda: [w.url for w in pool.all("decode")] == [d2.url])
                assert await complete(s, proxy.url) == 200 and len(d2.generate_calls) == 1
        finally:
            await api.stop()
            for w in (d1, d2, p):
                await w.stop()
    run(body())


def test_a_terminating_decoder_finishes_its_stream_and_gets_nothing_new():
    async def body():
        api, d1, d2 = FakeK8sAPI(), FakeWorker("decode", hang_stream_after_first=True), FakeWorker("decode")
        await started(d1, d2)
        url = await api.start()
        api.put(slice_of(d1, "dec-1"))
        try:
            async with serve_in_background(pd_config(url)) as proxy, aiohttp.ClientSession() as s:
                state = proxy.state
                await until(lambda: len(state.pool.all("decode")) == 1)
                worker = state.pool.all("decode")[0]
                store(state.kv_index, d1.url, b"h1")
                stream = asyncio.create_task(complete(s, proxy.url, stream=True))
                await asyncio.wait_for(d1.received.wait(), 5)  # in flight on d1
                api.put(slice_of(d1, "dec-1", ready=False, serving=True, terminating=True))
                api.put(slice_of(d2, "dec-2"))
                await until(lambda: [w.url for w in state.pool.admitted("decode")] == [d2.url])
                for _ in range(3):
                    assert await complete(s, proxy.url) == 200
                assert len(d1.generate_calls) == 1 and len(d2.generate_calls) == 3
                assert worker in state.pool.all("decode") and worker.terminating and worker.healthy
                assert worker.in_flight == 1 and state.kv_index.held(d1.url) == {0: {block_key(b"h1")}}
                async with s.get(proxy.url + "/health") as r:
                    assert (await r.json())["terminating"] == [d1.url]
                d1.release.set()
                assert await asyncio.wait_for(stream, 5) == 200 and not d1.client_gone.is_set()
                api.delete("dec-1")  # the pod is gone
                await until(lambda: [w.url for w in state.pool.all("decode")] == [d2.url])
        finally:
            await api.stop()
            for w in (d1, d2):
                await w.stop()
    run(body())


def test_a_readiness_blip_keeps_the_kv_index_within_the_grace_period():
    async def body():
        api, d1 = FakeK8sAPI(), FakeWorker("decode")
        await started(d1)
        url = await api.start()
        api.put(slice_of(d1, "dec"))
        try:
            async with serve_in_background(proxy_config(url, kv_index_grace_s=0.5)) as proxy:
                state, kv = proxy.state, proxy.state.kv_index
                await until(lambda: len(state.pool.all("decode")) == 1)
                store(kv, d1.url, b"h1")
                kept = kv.workers[d1.url]

                async def blip(**back) -> None:
                    api.put(slice_of(d1, "dec", ready=False))
                    await until(lambda: not state.pool.all("decode"))
                    assert d1.url not in kv.workers
                    api.put(slice_of(d1, "dec", **back))
                    await until(lambda: len(state.pool.all("decode")) == 1)

                await blip()  # back within the grace period: the same index
                assert kv.workers[d1.url] is kept and kv.held(d1.url) == {0: {block_key(b"h1")}}
                await blip(uid="another-pod")  # the same address, another engine: empty
                assert kv.workers.get(d1.url) is not kept
                store(kv, d1.url, b"h2")
                assert kv.held(d1.url) == {0: {block_key(b"h2")}}
                api.put(slice_of(d1, "dec", ready=False, uid="another-pod"))
                await until(lambda: not state.pool.all("decode"))
                await asyncio.sleep(0.7)  # past the grace period
                api.put(slice_of(d1, "dec", uid="another-pod"))
                await until(lambda: len(state.pool.all("decode")) == 1)
                assert d1.url not in kv.workers and not kv.retired
        finally:
            await api.stop()
            await d1.stop()
    run(body())
