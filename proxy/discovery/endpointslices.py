"""Workers from Kubernetes EndpointSlices (discovery.k8s.io/v1), as pure functions of the slices.

One slice carries ports at its top and endpoints below them:

    {"metadata": {"name": "hybrid-pd-decode-x7k2p", "labels": {the Service's labels}},
     "addressType": "IPv4",
     "ports": [{"name": "http", "port": 8200}, {"name": "kv-events", "port": 5710},
               {"name": "params-inbox", "port": 5720}],
     "endpoints": [{"addresses": ["10.0.0.7"], "targetRef": {"kind": "Pod", "uid": "..."},
                    "conditions": {"ready": true, "serving": true, "terminating": false}}]}

An endpoint's OpenAI URL is http://<address>:<port named `http`>, its KV events tcp://<address>:<`kv-events`>, a
decoder's params inbox (--early-decode) tcp://<address>:<`params-inbox`> where its slice names one.
Its conditions decide what the proxy does with it (nil `ready` and `serving` mean true, nil `terminating` false):

    ready, not terminating         -> a worker that takes new requests
    terminating, still serving     -> a worker that takes none, but is not dead: its requests in flight finish,
                                      its KV events and index stay (WorkerSpec.terminating)
    otherwise (not ready, or gone) -> not a worker now (its KV index is kept for --kv-index-grace-s)

The endpoint's pod UID (targetRef.uid) is its engine's identity: the same address with another UID is another
engine, whose cache starts empty.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..config.sections import WorkerSpec


def slice_workers(
    s: dict[str, Any],
    http_port_name: str = "http",
    events_port_name: str = "kv-events",
    inbox_port_name: str = "params-inbox",
) -> list[WorkerSpec]:
    """The workers one EndpointSlice names (taking requests or terminating), in its order."""
    ports = {p.get("name"): p.get("port") for p in s.get("ports") or [] if isinstance(p, dict)}
    http, events, inbox = ports.get(http_port_name), ports.get(events_port_name), ports.get(inbox_port_name)
    if http is None and len(ports) == 1:
        http = next(iter(ports.values()))  # an unnamed single port
    if not isinstance(http, int):
        return []
    out = []
    for ep in s.get("endpoints") or []:
        if not isinstance(ep, dict):
            continue
        state = _state(ep.get("conditions") or {})
        if state is None:
            continue
        ref = ep.get("targetRef") or {}
        identity = (ref.get("uid") or ref.get("name") or None) if isinstance(ref, dict) else None
        for addr in (ep.get("addresses") or [])[:1]:  # all of an endpoint's addresses are one pod's
            host = f"[{addr}]" if ":" in addr else addr
            out.append(
                WorkerSpec(
                    f"http://{host}:{http}",
                    f"tcp://{host}:{events}" if isinstance(events, int) else None,
                    f"tcp://{host}:{inbox}" if isinstance(inbox, int) else None,
                    identity=identity,
                    terminating=state == "terminating",
                )
            )
    return out


def _state(conditions: dict[str, Any]) -> str | None:
    ready = conditions.get("ready") is not False
    serving = conditions.get("serving", ready) is not False
    if conditions.get("terminating") is True:
        return "terminating" if serving else None
    return "ready" if ready else None


def merge(
    slices: Iterable[dict[str, Any]],
    http_port_name: str = "http",
    events_port_name: str = "kv-events",
    inbox_port_name: str = "params-inbox",
) -> tuple[WorkerSpec, ...]:
    """All slices' workers, one per URL (one taking requests wins over a terminating copy, which a slice being
    rewritten may briefly hold), sorted by URL."""
    by_url: dict[str, WorkerSpec] = {}
    for s in slices:
        for spec in slice_workers(s, http_port_name, events_port_name, inbox_port_name):
            old = by_url.get(spec.url)
            if old is None or (old.terminating and not spec.terminating):
                by_url[spec.url] = spec
    return tuple(sorted(by_url.values(), key=lambda w: w.url))
