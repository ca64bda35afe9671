"""The bounded queue in front of the workers: at most `max_in_flight` requests are served at once, at most
`max_queue` wait for a slot, and none waits longer than `queue_timeout_s`. Past that the client gets a 429 at
once (retry later) instead of a hang.

A counter and a FIFO of waiting futures rather than an asyncio.Semaphore: a request that finds a free slot
takes it without awaiting anything, and a freed slot is handed straight to the oldest waiter. The in-flight
and queued gauges read the counters when scraped instead of being updated per request."""

from __future__ import annotations

import asyncio
from collections import deque

from .config.sections import AdmissionConfig
from .errors import Overloaded
from .metrics import ProxyMetrics
from .timers import expire


class Admission:
    def __init__(self, cfg: AdmissionConfig, metrics: ProxyMetrics):
        self.cfg = cfg
        self.active = 0
        self.waiting = 0  # requests waiting for a slot (a handed-over or expired future may linger in _waiters)
        self._waiters: deque[asyncio.Future] = deque()
        metrics.in_flight.set_function(lambda: self.active)
        metrics.queued.set_function(lambda: self.waiting)

    def slot(self) -> _Slot:
        """`async with admission.slot():` holds one of the max_in_flight slots (a class, not a generator-based
        context manager: this runs once per request)."""
        return _Slot(self)

    def try_enter(self) -> bool:
        """Take a free slot at once (True; give it back with exit()), or False: wait() for one."""
        if self.active < self.cfg.max_in_flight:  # then nobody waits: a freed slot goes to a waiter first
            self.active += 1
            return True
        return False

    async def wait(self) -> None:
        """Wait for a slot (give it back with exit()); Overloaded where the queue is full or the wait too long.
        (slot() in two steps, for the request path: a free slot is taken without a coroutine.)"""
        if self.waiting >= self.cfg.max_queue:
            raise Overloaded(
                f"the proxy queue is full ({self.cfg.max_in_flight} in flight, {self.waiting} waiting); retry later"
            )
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._waiters.append(fut)
        self.waiting += 1
        timer = loop.call_later(self.cfg.queue_timeout_s, expire, fut)
        try:
            await fut  # a freed slot is handed over: `active` already counts this request
        except TimeoutError:
            raise Overloaded(f"no slot freed within {self.cfg.queue_timeout_s:g} s; retry later") from None
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self.exit()  # the slot came with the cancellation: pass it on
            raise
        finally:
            timer.cancel()
            self.waiting -= 1
            if self._waiters and self._waiters[0] is fut:
                self._waiters.popleft()
            elif fut in self._waiters:
                self._waiters.remove(fut)

    async def _enter(self) -> None:
        if not self.try_enter():
            await self.wait()

    def exit(self) -> None:
        """Give a slot back: to the oldest waiter, else free."""
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)  # the slot goes to the oldest waiter
                return
        self.active -= 1


class _Slot:
    __slots__ = ("admission",)

    def __init__(self, admission: Admission):
        self.admission = admission

    async def __aenter__(self) -> None:
        await self.admission._enter()

    async def __aexit__(self, *exc: object) -> None:
        self.admission.exit()
