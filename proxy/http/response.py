"""One worker's answer as the proxy's HTTP client (client.py) receives it: status and headers at once, the body
as it arrives, read in one of two ways:

    data = await resp.read(timeout)          # the whole body
    data = await resp.readany(timeout)       # whatever arrived (waits for some); b"" at the end
    await resp.pipe(sink)                    # hands what arrives to sink(data) -> bool, until the end

The connection (client._Connection, a Wire) feeds it with _feed / _finish, and stops reading while more than
UNREAD_LIMIT bytes wait here (a client that lags holds the worker back, not the proxy's memory); close() drops an
unfinished answer's connection, so that the worker sees its client leave.

pipe() is for a stream relayed at a decoder's pace: each piece would otherwise wake the reading task (a future,
a callback on the loop, a step through the task's awaits) for a few bytes. The sink runs in the connection's
callback, once per read from the socket (whatever that read held, `_to_sink`), and says False where it cannot
take a piece now: the piece stays here, and the piping task wakes to read it the usual way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from ..timers import expire

UNREAD_LIMIT = 1 << 20


class Leave:
    """How a caller that stops waiting (cancelled, or its timeout passed) leaves its answer behind, instead of
    dropping the connection (which a worker takes as its client leaving): the connection reads the answer to its
    end unseen and goes back to the pool, or is dropped at `until` (a loop time); then on_end() runs. `taken`
    tells the caller that it happened (on_end is then the connection's to call)."""

    __slots__ = ("until", "on_end", "taken")

    def __init__(self, until: float, on_end: Callable[[], None]):
        self.until, self.on_end, self.taken = until, on_end, False


class Wire(Protocol):
    """What an answer needs of the connection it arrives on (client.py's)."""

    loop: asyncio.AbstractEventLoop

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def abort(self) -> None: ...

    def leave(self, head: asyncio.Future | None, resp: Response | None, leave: Leave) -> None: ...


class Response:
    """One answer: status and headers at once, the body as it arrives."""

    __slots__ = (
        "status",
        "headers",
        "content_type",
        "_conn",
        "_chunks",
        "_done",
        "_exc",
        "_waiter",
        "_unread",
        "_paused",
        "_sink",
    )

    def __init__(self, conn: Wire, status: int, headers: dict[str, str]):
        self.status, self.headers, self._conn = status, headers, conn
        content_type = headers.get("content-type", "application/octet-stream")
        if content_type != "application/json":  # (what a worker's JSON answer says, as it is)
            content_type = content_type.split(";", 1)[0].strip().lower()
        self.content_type = content_type
        self._chunks: list[bytes] = []
        self._done = False
        self._exc: BaseException | None = None
        self._waiter: asyncio.Future | None = None
        self._unread = 0  # bytes in _chunks
        self._paused = False  # the connection stopped reading: _unread passed UNREAD_LIMIT
        self._sink: Callable[[bytes], bool] | None = None  # pipe()'s: takes what arrives, in the connection's callback

    async def readany(self, timeout: float | None = None) -> bytes:
        """Whatever body bytes have arrived (waits for some); b"" at the end of the body."""
        if not self._chunks and not self._done and self._exc is None:
            await self._wait(timeout)
        if self._chunks:
            return self._take()
        if self._exc is not None:
            raise self._exc
        return b""

    async def pipe(self, sink: Callable[[bytes], bool]) -> None:
        """Hand the body to `sink` as it arrives (in the connection's callback, one call per read), until the body
        ends or breaks, or the sink refuses a piece (returns False: the piece stays unread here, for readany).
        Returns at once where some of the body is unread already."""
        if self._chunks or self._done or self._exc is not None:
            return
        self._sink = sink
        try:
            await self._wait(None)
        finally:
            self._sink = None

    def _take(self) -> bytes:
        data = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
        self._chunks.clear()
        self._unread = 0
        if self._paused and not self._done:
            self._paused = False
            self._conn.resume()
        return data

    async def read(self, timeout: float | None = None) -> bytes:
        """The whole body; TimeoutError when it did not end within `timeout` seconds."""
        loop = self._conn.loop
        deadline = None if timeout is None else loop.time() + timeout
        while not self._done and self._exc is None:
            await self._wait(None if deadline is None else max(0.0, deadline - loop.time()))
        if self._exc is not None:
            raise self._exc
        data = b"".join(self._chunks)
        self._chunks.clear()
        return data

    @property
    def complete(self) -> bool:
        """The whole body arrived (some of it may be unread)."""
        return self._done

    def leave(self, leave: Leave) -> None:
        """The reader stops waiting: the connection reads the rest unseen (Leave)."""
        self._conn.leave(None, self, leave)

    def close(self) -> None:
        """Drop the connection unless the answer is complete (then it is back in the pool already): a worker
        sees its client leave mid-stream, and vLLM aborts the request."""
        if not self._done:
            self._conn.abort()

    async def _wait(self, timeout: float | None) -> None:
        loop = self._conn.loop
        self._waiter = fut = loop.create_future()
        timer = loop.call_later(timeout, expire, fut) if timeout is not None else None
        try:
            await fut
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    def _feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._unread += len(data)
        if self._unread > UNREAD_LIMIT and not self._paused:
            self._paused = True
            self._conn.pause()
        if self._sink is None:
            self._wake()  # (a sink takes it at the end of the connection's read: _to_sink)

    def _to_sink(self) -> None:
        """The connection's read ended with the body unfinished: what it brought goes to pipe()'s sink, or, where
        the sink refuses it, stays unread and wakes the piping task."""
        sink = self._sink
        if sink is None or not self._chunks:
            return
        data = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
        if sink(data):
            self._chunks.clear()
            self._unread = 0
            if self._paused:
                self._paused = False
                self._conn.resume()
        else:
            self._sink = None
            self._wake()

    def _finish(self, exc: BaseException | None = None) -> None:
        if exc is None:
            self._done = True
        else:
            self._exc = exc
        self._wake()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)
