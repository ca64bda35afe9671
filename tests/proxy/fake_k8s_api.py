"""A fake Kubernetes API server for discovery tests: EndpointSlices (discovery.k8s.io/v1), list and watch, on
127.0.0.1 (aiohttp).

    api = FakeK8sAPI(); url = await api.start()
    api.put(endpoint_slice("dec-1", "decode", [endpoint("10.0.0.1")]))   # ADDED or MODIFIED to every watcher
    api.delete("dec-1")                                                  # DELETED
    api.bookmark(); api.expire(); api.drop_watches([abrupt]); api.refuse_watch = 403
    api.watchers, api.watches_opened                                      # the watches open now, ever opened

Like the real one: a list answers items and the collection's resourceVersion; a watch streams chunked JSON
lines {"type", "object"} of the events after the resourceVersion it names (410 Gone when that is older than
the history kept, `expire()`), filtered by labelSelector (equality terms only).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

PATH = "/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"


def endpoint(ip: str, ready: bool = True, serving: bool | None = None, terminating: bool | None = None,
             uid: str | None = None) -> dict[str, Any]:
    conditions: dict[str, Any] = {"ready": ready}
    if serving is not None:
        conditions["serving"] = serving
    if terminating is not None:
        conditions["terminating"] = terminating
    return {"addresses": [ip], "conditions": conditions,
            "targetRef": {"kind": "Pod", "name": f"pod-{ip}", "uid": uid or f"uid-{ip}"}}


def endpoint_slice(name: str, role: str, endpoints: list[dict[str, Any]], http: int = 8200,
                   events: int | None = 5710, instance: str = "hybrid-pd", inbox: int | None = None
                   ) -> dict[str, Any]:
    ports = [{"name": "http", "port": http, "protocol": "TCP"}]
    if events is not None:
        ports.append({"name": "kv-events", "port": events, "protocol": "TCP"})
    if inbox is not None:
        ports.append({"name": "params-inbox", "port": inbox, "protocol": "TCP"})
    labels = {"hybrid-pd/role": role, "app.kubernetes.io/instance": instance,
              "kubernetes.io/service-name": f"hybrid-pd-{role}"}
    return {"kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1", "addressType": "IPv4",
            "metadata": {"name": name, "labels": labels}, "endpoints": endpoints, "ports": ports}


def selects(selector: str, labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, _, v in (t.partition("=") for t in selector.split(",") if t))


class FakeK8sAPI:
    def __init__(self) -> None:
        self.slices: dict[str, dict[str, Any]] = {}
        self.history: list[tuple[int, str, dict[str, Any]]] = []  # (resourceVersion, type, object)
        self.rv = 100
        self.oldest_rv = 0  # a watch from before this gets 410 Gone
        self.refuse_watch: int | None = None  # answer watches with this HTTP status
        self.fail_lists = False
        self.requests: list[tuple[str, dict[str, str]]] = []  # (path, query)
        self.watchers: set[asyncio.Queue] = set()  # the watches streaming now
        self.watches_opened = 0  # ever: a test waits for a client's watches to be open before breaking them
        self._runner: web.AppRunner | None = None

    async def start(self) -> str:
        app = web.Application()
        app.router.add_get(PATH, self._endpointslices)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    async def stop(self) -> None:
        self.drop_watches()
        if self._runner is not None:
            await self._runner.cleanup()

    # ---- what a test does to the cluster ------------------------------------------------------------------
    def put(self, s: dict[str, Any]) -> None:
        kind = "MODIFIED" if s["metadata"]["name"] in self.slices else "ADDED"
        self.slices[s["metadata"]["name"]] = self._event(kind, s)

    def delete(self, name: str) -> None:
        self._event("DELETED", self.slices.pop(name))

    def bookmark(self) -> None:
        self.rv += 1
        self._send(("BOOKMARK", {"kind": "EndpointSlice", "metadata": {"resourceVersion": str(self.rv)}}))

    def expire(self) -> None:
        """Compaction: watches from before the current resourceVersion get 410 Gone; open ones an ERROR event."""
        self.oldest_rv = self.rv
        self._send(("ERROR", {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410,
                              "reason": "Expired", "message": "too old resource version"}))

    def drop_watches(self, abrupt: bool = False) -> None:
        """End every open watch: as its timeout would (the chunked body ends), or by cutting the connection."""
        self._send(("ABORT", {}) if abrupt else None)

    # ---- the API ----------------------------------------------------------------------------------------
    def _event(self, kind: str, s: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        s = json.loads(json.dumps(s))
        s["metadata"]["resourceVersion"] = str(self.rv)
        self.history.append((self.rv, kind, s))
        self._send((kind, s))
        return s

    def _send(self, item: tuple[str, dict[str, Any]] | None) -> None:
        for q in self.watchers:
            q.put_nowait(item)

    async def _endpointslices(self, request: web.Request) -> web.StreamResponse:
        query = dict(request.query)
        self.requests.append((request.path, query))
        selector = query.get("labelSelector", "")
        if query.get("watch") not in ("1", "true"):
            if self.fail_lists:
                return web.json_response({"kind": "Status", "code": 500}, status=500)
            items = [s for s in self.slices.values() if selects(selector, s["metadata"]["labels"])]
            return web.json_response({"kind": "EndpointSliceList", "apiVersion": "discovery.k8s.io/v1",
                                      "metadata": {"resourceVersion": str(self.rv)}, "items": items})
        if self.refuse_watch is not None:
            return web.json_response({"kind": "Status", "code": self.refuse_watch}, status=self.refuse_watch)
        since = int(query.get("resourceVersion") or self.rv)
        if since < self.oldest_rv:
            return web.json_response({"kind": "Status", "code": 410, "reason": "Expired"}, status=410)
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        q: asyncio.Queue = asyncio.Queue()
        for rv, kind, s in self.history:
            if rv > since:
                q.put_nowait((kind, s))
        self.watchers.add(q)
        self.watches_opened += 1
        try:
            while (item := await q.get()) is not None:
                kind, obj = item
                if kind == "ABORT":
                    assert request.transport is not None
                    request.transport.abort()
                    break
                if kind in ("ERROR", "BOOKMARK") or selects(selector, obj["metadata"]["labels"]):
                    await resp.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")
                if kind == "ERROR":
                    break
        finally:
            self.watchers.discard(q)
        return resp
