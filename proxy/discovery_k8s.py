"""Workers from Kubernetes: the ready endpoints of the Services labelled for each role, polled.

    GET /api/v1/namespaces/{ns}/services?labelSelector=hybrid-pd/role=decode    -> Service names
    GET /api/v1/namespaces/{ns}/endpoints/{name}                                 -> ready pod IPs and ports

A pod's OpenAI URL is http://<ip>:<port named `http`>, its KV events tcp://<ip>:<port named `kv-events`>
(deploy/k8s/base/services.yaml). Not-ready addresses are left out: vLLM is ready once its model is loaded.
A failed poll keeps the last known workers (the health checks still watch them).
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from urllib.parse import quote

import aiohttp
import msgspec

from .config import K8sConfig, WorkerSpec
from .errors import UpstreamError
from .state import ProxyState

log = logging.getLogger("hybrid_pd.proxy")
_decoder = msgspec.json.Decoder()


class DiscoveryError(UpstreamError):
    """The Kubernetes API did not answer what discovery needs."""


def api_base(cfg: K8sConfig, env: dict[str, str] | None = None) -> str:
    if cfg.api_url:
        return cfg.api_url.rstrip("/")
    env = dict(os.environ) if env is None else env
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise DiscoveryError("not in a Kubernetes pod (no KUBERNETES_SERVICE_HOST): pass --k8s-api-url")
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


class K8sDiscovery:
    def __init__(self, cfg: K8sConfig, session: aiohttp.ClientSession, timeout_s: float = 10.0):
        self.cfg = cfg
        self.session = session
        self.base = api_base(cfg)
        self.timeout_s = timeout_s
        self.ssl: ssl.SSLContext | bool = True
        if self.base.startswith("https") and os.path.exists(cfg.ca_file):
            self.ssl = ssl.create_default_context(cafile=cfg.ca_file)

    def _headers(self) -> dict[str, str]:
        try:
            with open(self.cfg.token_file, encoding="utf-8") as f:  # re-read: projected tokens rotate
                return {"Authorization": f"Bearer {f.read().strip()}"}
        except OSError:
            return {}

    async def _get(self, path: str) -> dict:
        try:
            async with asyncio.timeout(self.timeout_s):
                async with self.session.get(self.base + path, headers=self._headers(), ssl=self.ssl) as r:
                    raw = await r.read()
                    if r.status != 200:
                        raise DiscoveryError(f"Kubernetes API {path} answered HTTP {r.status}: {raw[:200]!r}")
                    out = _decoder.decode(raw)
        except (aiohttp.ClientError, OSError, TimeoutError, msgspec.DecodeError) as e:
            raise DiscoveryError(f"Kubernetes API {path}: {e!r}") from None
        if not isinstance(out, dict):
            raise DiscoveryError(f"Kubernetes API {path} answered something that is not an object")
        return out

    async def workers(self, selector: str) -> list[WorkerSpec]:
        ns = quote(self.cfg.namespace, safe="")
        services = await self._get(f"/api/v1/namespaces/{ns}/services?labelSelector={quote(selector, safe='')}")
        out: list[WorkerSpec] = []
        for svc in services.get("items") or []:
            name = ((svc.get("metadata") or {}).get("name")) or ""
            if not name:
                continue
            endpoints = await self._get(f"/api/v1/namespaces/{ns}/endpoints/{quote(name, safe='')}")
            out.extend(self._specs(endpoints))
        return sorted(set(out), key=lambda s: s.url)

    def _specs(self, endpoints: dict) -> list[WorkerSpec]:
        out = []
        for subset in endpoints.get("subsets") or []:
            ports = {p.get("name"): p.get("port") for p in subset.get("ports") or [] if isinstance(p, dict)}
            http, events = ports.get(self.cfg.http_port_name), ports.get(self.cfg.events_port_name)
            if http is None and len(ports) == 1:
                http = next(iter(ports.values()))  # an unnamed single port
            if not isinstance(http, int):
                continue
            for addr in subset.get("addresses") or []:
                ip = addr.get("ip") if isinstance(addr, dict) else None
                if not ip:
                    continue
                host = f"[{ip}]" if ":" in ip else ip
                out.append(WorkerSpec(f"http://{host}:{http}", f"tcp://{host}:{events}" if isinstance(events, int)
                                      else None))
        return out


async def discover_once(state: ProxyState, discovery: K8sDiscovery) -> None:
    cfg = state.config.k8s
    found = {role: await discovery.workers(sel) for role, sel in (("prefill", cfg.prefill_selector),
                                                                   ("decode", cfg.decode_selector))}
    for role, specs in found.items():
        if [w.url for w in state.pool.all(role)] != [s.url for s in specs]:
            log.info("discovered %d %s workers: %s", len(specs), role, ", ".join(s.url for s in specs) or "-")
        state.pool.set_workers(role, specs)  # type: ignore[arg-type]


async def discovery_loop(state: ProxyState) -> None:
    discovery = K8sDiscovery(state.config.k8s, state.upstream.session, state.config.timeouts.connect_s * 2)
    while True:
        try:
            await discover_once(state, discovery)
        except DiscoveryError as e:
            log.warning("Kubernetes discovery failed, keeping the last known workers: %s", e)
        except Exception:  # top of a background loop
            log.exception("Kubernetes discovery round failed")
        await asyncio.sleep(state.config.k8s.poll_interval_s)
