"""The bounded queue in front of the workers: at most `max_in_flight` requests are served at once, at most
`max_queue` wait for a slot, and none waits longer than `queue_timeout_s`. Past that the client gets a 429 at
once (retry later) instead of a hang."""

from __future__ import annotations

import asyncio

from .config import AdmissionConfig
from .errors import Overloaded
from .metrics import ProxyMetrics


class Admission:
    def __init__(self, cfg: AdmissionConfig, metrics: ProxyMetrics):
        self.cfg = cfg
        self.metrics = metrics
        self._slots = asyncio.Semaphore(cfg.max_in_flight)
        self.waiting = 0
        self.active = 0

    def slot(self) -> _Slot:
        """`async with admission.slot():` holds one of the max_in_flight slots (a class, not a generator-based
        context manager: this runs once per request)."""
        return _Slot(self)

    async def _enter(self) -> None:
        if self._slots.locked():
            if self.waiting >= self.cfg.max_queue:
                raise Overloaded(f"the proxy queue is full ({self.cfg.max_in_flight} in flight, "
                                 f"{self.waiting} waiting); retry later")
            self.waiting += 1
            self.metrics.queued.inc()
            try:
                async with asyncio.timeout(self.cfg.queue_timeout_s):
                    await self._slots.acquire()
            except TimeoutError:
                raise Overloaded(f"no slot freed within {self.cfg.queue_timeout_s:g} s; retry later") from None
            finally:
                self.waiting -= 1
                self.metrics.queued.dec()
        else:
            await self._slots.acquire()
        self.active += 1
        self.metrics.in_flight.inc()

    def _exit(self) -> None:
        self.active -= 1
        self.metrics.in_flight.dec()
        self._slots.release()


class _Slot:
    __slots__ = ("admission",)

    def __init__(self, admission: Admission):
        self.admission = admission

    async def __aenter__(self) -> None:
        await self.admission._enter()

    async def __aexit__(self, *exc: object) -> None:
        self.admission._exit()
