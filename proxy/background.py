"""The proxy's background tasks, started with the app and stopped with it: active health checks, KV-event
subscriptions (one per worker that announces an events endpoint), Kubernetes discovery."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from .health import health_loop
from .state import ProxyState

log = logging.getLogger("hybrid_pd.proxy")


class Background:
    def __init__(self, state: ProxyState):
        self.state = state
        self.tasks: list[asyncio.Task] = []

    async def start(self) -> None:
        for w in self.state.pool.all():
            self.state.metrics.worker_healthy.labels(w.role, w.url).set(1)
        if self.state.config.health.interval_s > 0:
            self.tasks.append(asyncio.create_task(health_loop(self.state), name="health"))

    async def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        for t in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self.tasks.clear()
