"""Active health checks: GET /health on every worker every `interval_s`; `failures_to_eject` failures in a
row eject it from routing, `successes_to_readmit` successes in a row bring it back."""

from __future__ import annotations

import asyncio
import logging

from .state import ProxyState
from .workers import Worker

log = logging.getLogger("hybrid_pd.proxy")


async def check_once(state: ProxyState) -> None:
    workers = state.pool.all()
    results = await asyncio.gather(*(state.upstream.is_healthy(w.url) for w in workers))
    for w, ok in zip(workers, results):
        record(state, w, ok)


def record(state: ProxyState, w: Worker, ok: bool) -> None:
    cfg = state.config.health
    if ok:
        w.failures = 0
        if not w.healthy:
            w.successes += 1
            if w.successes >= cfg.successes_to_readmit:
                state.pool.readmit(w)
    else:
        w.successes = 0
        w.failures += 1
        if w.healthy and w.failures >= cfg.failures_to_eject:
            state.pool.eject(w, f"{w.failures} failed health checks")
    state.metrics.worker_healthy.labels(w.role, w.url).set(1 if w.healthy else 0)
