"""Deadlines as loop timers on futures, instead of asyncio.timeout contexts on the request path.

timer = loop.call_at(deadline, expire, fut)     # fut raises TimeoutError at the deadline, unless done before
"""

from __future__ import annotations

import asyncio


def expire(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_exception(TimeoutError())


def time_left(loop: asyncio.AbstractEventLoop, deadline: float) -> float:
    """Seconds from now (loop time) to `deadline`; negative once it passed. The loop is passed in: on Python
    3.11, asyncio.get_running_loop() makes a getpid system call each time."""
    return deadline - loop.time()
