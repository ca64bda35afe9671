"""Workers from Kubernetes: the EndpointSlices (discovery.k8s.io/v1) of each role's Services, listed, then
watched.

    GET /apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices?labelSelector=hybrid-pd/role=decode  (list)
    ... &watch=1&resourceVersion=RV&allowWatchBookmarks=true                                          (watch)

EndpointSlices carry their Service's labels, so the role selectors (with the release's
app.kubernetes.io/instance) pick the slices of that release's Services. Each role follows its own watch:

    list -> workers -> watch from the list's resourceVersion -> each event -> workers -> ...
      ^        a watch that ends (its timeout, a dropped connection) is renewed from the last resourceVersion
      |-------- 410 Gone (the resourceVersion is too old): list again at once
      |-------- any other failure: keep the last known workers, list again after --k8s-poll-interval-s

so a cluster that forbids or breaks watches is polled. What an endpoint's conditions mean (ready, serving,
terminating) is endpointslices.py's; the RBAC this needs is exactly endpointslices list + watch
(deploy/k8s/base/rbac.yaml).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any
from urllib.parse import quote

import aiohttp

from ..config.sections import K8sConfig, WorkerSpec
from ..state import ProxyState
from ..workers import Role
from .endpointslices import merge
from .k8s_api import DiscoveryError, K8sAPI, WatchExpired, api_base

log = logging.getLogger("hybrid_pd.proxy")
__all__ = ["DiscoveryError", "K8sDiscovery", "api_base", "discovery_loop"]
QUICK_WATCH_S = 1.0  # a watch that ends this soon with nothing in it counts as a failure (no busy loop)


class K8sDiscovery:
    """The workers a label selector finds, once (`workers`) or as they change (`follow`)."""

    def __init__(self, cfg: K8sConfig, session: aiohttp.ClientSession, timeout_s: float = 10.0):
        self.cfg = cfg
        self.api = K8sAPI(cfg, session, timeout_s)
        self.path = f"/apis/discovery.k8s.io/v1/namespaces/{quote(cfg.namespace, safe='')}/endpointslices"

    def specs(self, slices: dict[str, dict[str, Any]]) -> tuple[WorkerSpec, ...]:
        return merge(slices.values(), self.cfg.http_port_name, self.cfg.events_port_name, self.cfg.inbox_port_name)

    async def workers(self, selector: str) -> list[WorkerSpec]:
        items, _ = await self.api.list(self.path, selector)
        return list(self.specs(_by_name(items)))

    async def follow(self, role: Role, selector: str, state: ProxyState) -> None:
        """Keep `role`'s workers in the pool equal to what the selector's slices name; until cancelled."""
        while True:
            fresh = False  # watching from the list's own resourceVersion, no event yet
            try:
                items, rv = await self.api.list(self.path, selector)
                slices = _by_name(items)
                publish(state, role, self.specs(slices))
                fresh = True
                while True:
                    started, events = time.monotonic(), 0
                    async for kind, obj in self.api.watch(self.path, selector, rv):
                        events, fresh = events + 1, False
                        rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                        if _apply(slices, kind, obj):
                            publish(state, role, self.specs(slices))
                    if not events and time.monotonic() - started < QUICK_WATCH_S:
                        raise DiscoveryError("the watch ended at once with no event")
                    fresh = False
            except WatchExpired as e:
                log.info("Kubernetes discovery of %s workers: %s; listing again", role, e)
                if fresh:  # the list's own resourceVersion was too old: no busy loop of lists
                    await asyncio.sleep(self.cfg.poll_interval_s)
            except DiscoveryError as e:
                log.warning(
                    "Kubernetes discovery of %s workers failed, keeping the last known ones; polling every "
                    "%g s until a watch holds: %s",
                    role,
                    self.cfg.poll_interval_s,
                    e,
                )
                await asyncio.sleep(self.cfg.poll_interval_s)
            except Exception:  # top of a background loop: log it, keep the last known workers, try again
                log.exception("Kubernetes discovery of %s workers failed", role)
                await asyncio.sleep(self.cfg.poll_interval_s)


def _by_name(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {str((s.get("metadata") or {}).get("name")): s for s in items}


def _apply(slices: dict[str, dict[str, Any]], kind: str, obj: dict[str, Any]) -> bool:
    """One watch event into the slices by name; True when the slices changed."""
    name = str((obj.get("metadata") or {}).get("name"))
    if kind in ("ADDED", "MODIFIED"):
        slices[name] = obj
        return True
    if kind == "DELETED":
        return slices.pop(name, None) is not None
    return False  # BOOKMARK: only a newer resourceVersion


def publish(state: ProxyState, role: Role, specs: tuple[WorkerSpec, ...]) -> None:
    before = [(w.url, w.terminating) for w in state.pool.all(role)]
    if before != [(s.url, s.terminating) for s in specs]:
        log.info(
            "discovered %d %s workers: %s",
            len(specs),
            role,
            ", ".join(s.url + (" (terminating)" if s.terminating else "") for s in specs) or "-",
        )
    state.pool.set_workers(role, specs)


async def discovery_loop(state: ProxyState) -> None:
    cfg = state.config.k8s
    discovery = K8sDiscovery(cfg, state.upstream.session, state.config.timeouts.connect_s * 2)
    await asyncio.gather(
        discovery.follow("prefill", cfg.prefill_selector, state), discovery.follow("decode", cfg.decode_selector, state)
    )
