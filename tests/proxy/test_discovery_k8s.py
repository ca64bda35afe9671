"""Kubernetes discovery against a fake API server (an aiohttp app on 127.0.0.1)."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from hybrid_pd.proxy.app import serve_in_background
from hybrid_pd.proxy.config import ProxyConfig
from hybrid_pd.proxy.discovery_k8s import DiscoveryError, K8sDiscovery
from hybrid_pd.proxy.config import K8sConfig, WorkerSpec
from tests.proxy.fakes import FakeWorker, run


def endpoints(ip_ports: list[tuple[str, int, int | None]], not_ready: list[str] = ()) -> dict:
    subsets = []
    for ip, http, events in ip_ports:
        ports = [{"name": "http", "port": http, "protocol": "TCP"}]
        if events is not None:
            ports.append({"name": "kv-events", "port": events, "protocol": "TCP"})
        subsets.append({"addresses": [{"ip": ip}], "notReadyAddresses": [{"ip": x} for x in not_ready],
                        "ports": ports})
    return {"kind": "Endpoints", "subsets": subsets}


class FakeAPI:
    def __init__(self) -> None:
        self.services: dict[str, list[str]] = {}  # role -> service names
        self.endpoints: dict[str, dict] = {}
        self.requests: list[tuple[str, str, str | None]] = []
        self.fail = False

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/api/v1/namespaces/{ns}/services", self._services)
        app.router.add_get("/api/v1/namespaces/{ns}/endpoints/{name}", self._endpoints)
        return app

    async def _services(self, request: web.Request) -> web.Response:
        self.requests.append((request.path, request.query.get("labelSelector", ""),
                              request.headers.get("Authorization")))
        if self.fail:
            return web.json_response({"kind": "Status", "code": 500}, status=500)
        role = request.query["labelSelector"].split("=")[-1]
        items = [{"metadata": {"name": n, "labels": {"hybrid-pd/role": role}}} for n in self.services.get(role, [])]
        return web.json_response({"kind": "ServiceList", "items": items})

    async def _endpoints(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in self.endpoints:
            return web.json_response({"kind": "Status", "code": 404}, status=404)
        return web.json_response(self.endpoints[name])


async def start(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"


def test_lists_ready_endpoints_of_labelled_services(tmp_path):
    async def body():
        api = FakeAPI()
        api.services = {"decode": ["dec-a", "dec-b"], "prefill": ["pre"]}
        api.endpoints = {"dec-a": endpoints([("10.0.0.2", 8200, 5710), ("10.0.0.1", 8200, 5710)], ["10.0.0.9"]),
                         "dec-b": endpoints([("fd00::5", 8200, None)]),
                         "pre": endpoints([("10.0.1.1", 8100, 5700)])}
        token = tmp_path / "token"
        token.write_text("secret\n")
        runner, url = await start(api.app())
        try:
            cfg = K8sConfig(api_url=url, namespace="serving", token_file=str(token))
            async with aiohttp.ClientSession() as s:
                d = K8sDiscovery(cfg, s)
                assert await d.workers("hybrid-pd/role=decode") == [
                    WorkerSpec("http://10.0.0.1:8200", "tcp://10.0.0.1:5710"),
                    WorkerSpec("http://10.0.0.2:8200", "tcp://10.0.0.2:5710"),
                    WorkerSpec("http://[fd00::5]:8200", None)]
                assert api.requests[0] == ("/api/v1/namespaces/serving/services", "hybrid-pd/role=decode",
                                           "Bearer secret")
                api.fail = True
                try:
                    await d.workers("hybrid-pd/role=decode")
                    raise AssertionError("a failing API must raise DiscoveryError")
                except DiscoveryError as e:
                    assert "HTTP 500" in str(e)
        finally:
            await runner.cleanup()
    run(body())


def test_proxy_follows_discovery():
    async def body():
        api = FakeAPI()
        d1, d2, p = FakeWorker("decode"), FakeWorker("decode"), FakeWorker("prefill")
        for w in (d1, d2, p):
            await w.start()
        def eps(w):
            host, port = w.url.removeprefix("http://").split(":")
            return endpoints([(host, int(port), None)])
        api.services = {"decode": ["dec"], "prefill": ["pre"]}
        api.endpoints = {"dec": eps(d1), "pre": eps(p)}
        runner, url = await start(api.app())
        config = ProxyConfig.from_flat({"port": 0, "discovery": "k8s", "k8s_api_url": url, "health_interval": 0,
                                        "k8s_poll_interval_s": 0.05, "k8s_token_file": "/nonexistent"})
        try:
            async with serve_in_background(config) as proxy:
                pool = proxy.state.pool

                async def until(urls):
                    while [w.url for w in pool.all("decode")] != urls:
                        await asyncio.sleep(0.01)
                await asyncio.wait_for(until([d1.url]), 5)
                assert [w.url for w in pool.all("prefill")] == [p.url]
                async with aiohttp.ClientSession() as s:
                    async with s.post(proxy.url + "/v1/completions", json={"prompt": "x"}) as r:
                        assert r.status == 200
                assert len(d1.generate_calls) == 1 and len(p.generate_calls) == 1
                api.endpoints["dec"] = eps(d2)  # the decoder pod was replaced
                await asyncio.wait_for(until([d2.url]), 5)
                api.fail = True  # the API goes away: the last known workers stay
                n = len(api.requests)
                while len(api.requests) < n + 2:
                    await asyncio.sleep(0.01)
                assert [w.url for w in pool.all("decode")] == [d2.url]
        finally:
            await runner.cleanup()
            for w in (d1, d2, p):
                await w.stop()
    run(body())
