"""Kubernetes discovery on EndpointSlices against a fake API server (tests/proxy/fake_k8s_api.py): what one list
finds, and a 200-pod fleet followed through its watch (terminating, deleted, a dropped watch, 410 Gone, a
cluster that refuses watches)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp
import pytest

from hybrid_pd.proxy.app import serve_in_background
from hybrid_pd.proxy.config import K8sConfig, ProxyConfig, WorkerSpec
from hybrid_pd.proxy.discovery.endpointslices import merge
from hybrid_pd.proxy.discovery.k8s import DiscoveryError, K8sDiscovery
from tests.proxy.fake_k8s_api import FakeK8sAPI, endpoint, endpoint_slice
from tests.proxy.fakes import run

DECODE = "app.kubernetes.io/instance=hybrid-pd,hybrid-pd/role=decode"
PREFILL = "app.kubernetes.io/instance=hybrid-pd,hybrid-pd/role=prefill"


def test_one_list_maps_conditions_ports_and_identities(tmp_path):
    async def body():
        api = FakeK8sAPI()
        url = await api.start()
        api.put(endpoint_slice("dec-a", "decode", [
            endpoint("10.0.0.2"), endpoint("10.0.0.1", uid="pod-1"),
            endpoint("10.0.0.3", ready=False, serving=True, terminating=True),  # draining: kept, no new requests
            endpoint("10.0.0.4", ready=False, serving=False, terminating=True),  # gone
            endpoint("10.0.0.5", ready=False)]))  # not ready (a readiness blip): not a worker now
        api.put(endpoint_slice("dec-b", "decode", [endpoint("fd00::5")], events=None, inbox=5720))
        api.put(endpoint_slice("dec-other", "decode", [endpoint("10.9.9.9")], instance="team-b"))
        api.put(endpoint_slice("pre", "prefill", [endpoint("10.0.1.1")], http=8100, events=5700))
        token = tmp_path / "token"
        token.write_text("secret\n")
        try:
            cfg = K8sConfig(api_url=url, namespace="serving", token_file=str(token))
            async with aiohttp.ClientSession() as s:
                d = K8sDiscovery(cfg, s)
                assert await d.workers(DECODE) == [
                    WorkerSpec("http://10.0.0.1:8200", "tcp://10.0.0.1:5710", identity="pod-1"),
                    WorkerSpec("http://10.0.0.2:8200", "tcp://10.0.0.2:5710", identity="uid-10.0.0.2"),
                    WorkerSpec("http://10.0.0.3:8200", "tcp://10.0.0.3:5710", identity="uid-10.0.0.3",
                               terminating=True),
                    WorkerSpec("http://[fd00::5]:8200", None, "tcp://[fd00::5]:5720", identity="uid-fd00::5")]
                path, query = api.requests[0]
                assert path == "/apis/discovery.k8s.io/v1/namespaces/serving/endpointslices"
                assert query == {"labelSelector": DECODE}
                api.fail_lists = True
                try:
                    await d.workers(DECODE)
                    raise AssertionError("a failing API must raise DiscoveryError")
                except DiscoveryError as e:
                    assert "HTTP 500" in str(e)
        finally:
            await api.stop()
    run(body())


def test_a_ready_copy_wins_over_a_terminating_one_in_another_slice():
    a = endpoint_slice("a", "decode", [endpoint("10.0.0.1", ready=False, serving=True, terminating=True)])
    b = endpoint_slice("b", "decode", [endpoint("10.0.0.1")])
    assert [w.terminating for w in merge([a, b])] == [False]
    assert [w.terminating for w in merge([b, a])] == [False]


def fleet_slices(n_slices: int = 4, per_slice: int = 50) -> list[dict]:
    """200 decode pods in 4 slices (no KV-event port: nothing to subscribe to at these addresses)."""
    return [endpoint_slice(f"dec-{i}", "decode", [endpoint(f"10.1.{i}.{j}") for j in range(per_slice)], events=None)
            for i in range(n_slices)]


async def until(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    async def poll() -> None:
        while not check():
            await asyncio.sleep(0.01)
    await asyncio.wait_for(poll(), timeout_s)


def n_lists(api: FakeK8sAPI) -> int:
    return sum(1 for _, q in api.requests if "watch" not in q)


async def watching(api: FakeK8sAPI, opened_before: int = 0) -> None:
    """Both roles' watches open, each opened after `opened_before` watches. A step that breaks watches (a drop,
    410 Gone) must wait for this: the pool shows a change as soon as a role's list lands, before its watch
    opens, and a watch opened after `expire()` from the list's resourceVersion is valid (no 410)."""
    await until(lambda: api.watches_opened >= opened_before + 2 and len(api.watchers) == 2)


def proxy_config(url: str, **extra) -> ProxyConfig:
    return ProxyConfig.from_flat({"port": 0, "discovery": "k8s", "k8s_api_url": url, "health_interval": 0,
                                  "k8s_token_file": "/nonexistent", "k8s_decode_selector": DECODE,
                                  "k8s_prefill_selector": PREFILL, "k8s_poll_interval_s": 0.2, **extra})


def test_a_200_pod_fleet_followed_through_its_watch():
    async def body():
        api = FakeK8sAPI()
        url = await api.start()
        slices = fleet_slices()
        for s in slices:
            api.put(s)
        try:
            async with serve_in_background(proxy_config(url)) as proxy:
                pool = proxy.state.pool
                await until(lambda: len(pool.all("decode")) == 200)
                assert len(pool.admitted("decode")) == 200
                await watching(api)
                lists = n_lists(api)
                first = pool.all("decode")[0]

                # one pod terminating (still serving): in the pool, not admitted, the same Worker object
                slices[0]["endpoints"][7] = endpoint("10.1.0.7", ready=False, serving=True, terminating=True)
                api.put(slices[0])
                await until(lambda: len(pool.admitted("decode")) == 199)
                gone = [w for w in pool.all("decode") if w.terminating]
                assert [w.url for w in gone] == ["http://10.1.0.7:8200"] and len(pool.all("decode")) == 200
                assert gone[0].healthy and pool.all("decode")[0] is first

                # one pod deleted: it disappears; a whole slice deleted: its 50 do
                del slices[1]["endpoints"][3]
                api.put(slices[1])
                await until(lambda: len(pool.all("decode")) == 199)
                assert "http://10.1.1.3:8200" not in {w.url for w in pool.all("decode")}
                api.delete("dec-2")
                await until(lambda: len(pool.all("decode")) == 149)
                api.bookmark()

                # the watch drops (cleanly, then abruptly): a change made meanwhile still arrives
                opened = api.watches_opened
                api.drop_watches()
                api.put(endpoint_slice("dec-2", "decode", [endpoint("10.1.2.0")], events=None))
                await until(lambda: len(pool.all("decode")) == 150)
                await watching(api, opened)
                assert n_lists(api) == lists  # renewed from its resourceVersion, not listed again
                opened = api.watches_opened
                api.drop_watches(abrupt=True)
                api.put(endpoint_slice("dec-2", "decode", [endpoint("10.1.2.0"), endpoint("10.1.2.1")], events=None))
                await until(lambda: len(pool.all("decode")) == 151)
                await watching(api, opened)
                assert n_lists(api) == lists + 2  # a failed watch: one poll round per role, then a watch again

                # 410 Gone (the history was compacted): listed again, then watched
                opened = api.watches_opened
                api.expire()
                api.put(endpoint_slice("dec-4", "decode", [endpoint("10.1.4.0")], events=None))
                await until(lambda: len(pool.all("decode")) == 152)
                await watching(api, opened)
                assert n_lists(api) == lists + 4
                api.put(endpoint_slice("dec-5", "decode", [endpoint("10.1.5.0")], events=None))
                await until(lambda: len(pool.all("decode")) == 153)
                assert n_lists(api) == lists + 4  # through the new watch
                watches = [q for _, q in api.requests if "watch" in q]
                assert all(q["allowWatchBookmarks"] == "true" and q["resourceVersion"] for q in watches)
                assert len(pool.all("prefill")) == 0
        finally:
            await api.stop()
    run(body(), timeout=30)


@pytest.mark.parametrize("status", [403, 410])  # forbidden; or Gone for every resourceVersion (no busy loop)
def test_a_cluster_that_refuses_watches_is_polled(status):
    async def body():
        api = FakeK8sAPI()
        api.refuse_watch = status
        url = await api.start()
        api.put(endpoint_slice("dec", "decode", [endpoint("10.0.0.1")], events=None))
        try:
            async with serve_in_background(proxy_config(url)) as proxy:
                pool = proxy.state.pool
                await until(lambda: [w.url for w in pool.all("decode")] == ["http://10.0.0.1:8200"])
                api.put(endpoint_slice("dec", "decode", [endpoint("10.0.0.2")], events=None))
                await until(lambda: [w.url for w in pool.all("decode")] == ["http://10.0.0.2:8200"])
                n = n_lists(api)
                await asyncio.sleep(1.0)
                assert n_lists(api) - n <= 2 * (1.0 / 0.2 + 1)  # per role, one list per --k8s-poll-interval-s
                api.fail_lists = True  # the API goes away as well: the last known workers stay
                n = len(api.requests)
                await until(lambda: len(api.requests) >= n + 4)
                assert [w.url for w in pool.all("decode")] == ["http://10.0.0.2:8200"]
        finally:
            await api.stop()
    run(body())
