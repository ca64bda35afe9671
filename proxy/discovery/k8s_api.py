"""The few Kubernetes API calls discovery makes: list a collection, and watch it from a resourceVersion.

    api = K8sAPI(cfg, session)
    items, rv = await api.list(path, selector)            # GET path?labelSelector=...
    async for kind, obj in api.watch(path, selector, rv):  # GET ...&watch=1&resourceVersion=rv (JSON lines)
        ...                                               # ADDED | MODIFIED | DELETED | BOOKMARK

A watch's end (its timeoutSeconds, or the connection dropped) ends the iteration; a 410 Gone (the
resourceVersion is too old, as an HTTP status or as an ERROR event) raises WatchExpired (list again); anything
else that fails raises DiscoveryError. aiohttp's errors are mapped here, once.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlencode

import aiohttp
import msgspec

from ..config.sections import K8sConfig
from ..errors import UpstreamError

_decoder = msgspec.json.Decoder()
MAX_EVENT_BYTES = 64 * 1024 * 1024  # one slice holds at most 1,000 endpoints: far below this


class DiscoveryError(UpstreamError):
    """The Kubernetes API did not answer what discovery needs."""


class WatchExpired(DiscoveryError):
    """410 Gone: the watch's resourceVersion is too old; list again."""


def api_base(cfg: K8sConfig, env: dict[str, str] | None = None) -> str:
    if cfg.api_url:
        return cfg.api_url.rstrip("/")
    env = dict(os.environ) if env is None else env
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise DiscoveryError("not in a Kubernetes pod (no KUBERNETES_SERVICE_HOST): pass --k8s-api-url")
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


class K8sAPI:
    def __init__(self, cfg: K8sConfig, session: aiohttp.ClientSession, timeout_s: float = 10.0):
        self.cfg, self.session, self.timeout_s = cfg, session, timeout_s
        self.base = api_base(cfg)
        self.ssl: ssl.SSLContext | bool = True
        if self.base.startswith("https") and os.path.exists(cfg.ca_file):
            self.ssl = ssl.create_default_context(cafile=cfg.ca_file)

    def _headers(self) -> dict[str, str]:
        try:
            with open(self.cfg.token_file, encoding="utf-8") as f:  # re-read: projected tokens rotate
                return {"Authorization": f"Bearer {f.read().strip()}"}
        except OSError:
            return {}

    async def list(self, path: str, selector: str) -> tuple[list[dict[str, Any]], str]:
        """(items, the list's resourceVersion)."""
        url = f"{self.base}{path}?{urlencode({'labelSelector': selector})}"
        try:
            async with asyncio.timeout(self.timeout_s):
                async with self.session.get(url, headers=self._headers(), ssl=self.ssl) as r:
                    raw = await r.read()
                    if r.status != 200:
                        raise DiscoveryError(f"Kubernetes API {path} answered HTTP {r.status}: {raw[:200]!r}")
                    out = _decoder.decode(raw)
        except (aiohttp.ClientError, OSError, TimeoutError, msgspec.DecodeError) as e:
            raise DiscoveryError(f"Kubernetes API {path}: {e!r}") from None
        if not isinstance(out, dict) or not isinstance(out.get("items", []), list):
            raise DiscoveryError(f"Kubernetes API {path} answered something that is not a list")
        items = [i for i in out.get("items") or [] if isinstance(i, dict)]
        return items, str((out.get("metadata") or {}).get("resourceVersion") or "")

    async def watch(self, path: str, selector: str, resource_version: str) -> AsyncIterator[tuple[str, dict]]:
        """(event type, object) from a watch that starts after `resource_version`."""
        query = {
            "labelSelector": selector,
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(int(self.cfg.watch_timeout_s)),
        }
        url = f"{self.base}{path}?{urlencode(query)}"
        timeout = aiohttp.ClientTimeout(total=self.cfg.watch_timeout_s + 30, connect=self.timeout_s)
        try:
            async with self.session.get(url, headers=self._headers(), ssl=self.ssl, timeout=timeout) as r:
                if r.status == 410:
                    raise WatchExpired(f"Kubernetes API {path}: resourceVersion {resource_version} is too old")
                if r.status != 200:
                    raise DiscoveryError(
                        f"Kubernetes API watch {path} answered HTTP {r.status}: {(await r.read())[:200]!r}"
                    )
                pending = b""
                async for piece in r.content.iter_any():  # our own lines: aiohttp's stop at 128 KiB
                    pending += piece
                    if len(pending) > MAX_EVENT_BYTES:
                        raise DiscoveryError(f"Kubernetes API watch {path}: an event over {MAX_EVENT_BYTES} bytes")
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        if line.strip():
                            yield _event(path, line)
        except (aiohttp.ClientError, OSError, TimeoutError, msgspec.DecodeError) as e:
            raise DiscoveryError(f"Kubernetes API watch {path}: {e!r}") from None


def _event(path: str, line: bytes) -> tuple[str, dict]:
    event = _decoder.decode(line)
    kind, obj = (event.get("type"), event.get("object")) if isinstance(event, dict) else (None, None)
    if not isinstance(kind, str) or not isinstance(obj, dict):
        raise DiscoveryError(f"Kubernetes API watch {path} sent something that is not a watch event")
    if kind == "ERROR":
        if obj.get("code") == 410:
            raise WatchExpired(f"Kubernetes API watch {path}: {obj.get('message') or 'resource version too old'}")
        raise DiscoveryError(f"Kubernetes API watch {path} sent an error: {obj.get('message') or obj}")
    return kind, obj
