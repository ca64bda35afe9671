"""One worker's answer as the proxy's HTTP client (http1.py) receives it: status and headers at once, the body
as it arrives, read in one of three ways:

    data = await resp.read(timeout)          # the whole body
    data = await resp.readany(timeout)       # whatever arrived (waits for some); b"" at the end
    resp.stream_to(on_data, on_end)          # every later piece handed over from the connection's callback
                                             # (but the last: see stream_to)

The connection (http1._Connection, a Wire) feeds it with _feed / _finish; close() drops an unfinished answer's
connection, so that the worker sees its client leave.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from .timers import expire


class Leave:
    """How a caller that stops waiting (cancelled, or its timeout passed) leaves its answer behind, instead of
    dropping the connection (which a worker takes as its client leaving): the connection reads the answer to its
    end unseen and goes back to the pool, or is dropped at `until` (a loop time); then on_end() runs. `taken`
    tells the caller that it happened (on_end is then the connection's to call)."""

    __slots__ = ("until", "on_end", "taken")

    def __init__(self, until: float, on_end: Callable[[], None]):
        self.until, self.on_end, self.taken = until, on_end, False


class Wire(Protocol):
    """What an answer needs of the connection it arrives on (http1's)."""

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
        "_on_data",
        "_on_end",
    )

    def __init__(self, conn: Wire, status: int, headers: dict[str, str]):
        self.status, self.headers, self._conn = status, headers, conn
        self.content_type = headers.get("content-type", "application/octet-stream").split(";", 1)[0].strip().lower()
        self._chunks: list[bytes] = []
        self._done = False
        self._exc: BaseException | None = None
        self._waiter: asyncio.Future | None = None
        self._on_data: Callable[[bytes], None] | None = None  # set by stream_to
        self._on_end: Callable[[BaseException | None], None] | None = None

    async def readany(self, timeout: float | None = None) -> bytes:
        """Whatever body bytes have arrived (waits for some); b"" at the end of the body."""
        if not self._chunks and not self._done and self._exc is None:
            await self._wait(timeout)
        if self._chunks:
            data = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
            self._chunks.clear()
            return data
        if self._exc is not None:
            raise self._exc
        return b""

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

    def stream_to(self, on_data: Callable[[bytes], None], on_end: Callable[[BaseException | None], None]) -> None:
        """Hand the rest of the body to `on_data` piece by piece, called from the connection's own callback as
        the bytes arrive (no task wakes up per piece: that is what a relay of many small SSE events pays for),
        then call `on_end(None)` at the body's end or `on_end(exc)` when it broke. Bytes that arrived already
        are handed over at once. The piece that arrives with the body's end stays here for readany(), so that
        the caller can send it with the end of its own answer (one write instead of two). Flow control is the
        caller's: pause_reading() / resume_reading()."""
        if self._chunks:
            data = b"".join(self._chunks)
            self._chunks.clear()
            on_data(data)
        if self._done or self._exc is not None:
            on_end(self._exc)
            return
        self._on_data, self._on_end = on_data, on_end

    @property
    def complete(self) -> bool:
        """The whole body arrived (some of it may be unread)."""
        return self._done

    def stop_streaming(self) -> None:
        """Hand nothing more to stream_to's callbacks."""
        self._on_data = self._on_end = None

    def pause_reading(self) -> None:
        self._conn.pause()

    def resume_reading(self) -> None:
        self._conn.resume()

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

    def _feed(self, data: bytes, last: bool = False) -> None:
        """`last`: the body ends with this piece (_finish follows at once)."""
        if self._on_data is not None and not last:
            self._on_data(data)
            return
        self._chunks.append(data)
        self._wake()

    def _finish(self, exc: BaseException | None = None) -> None:
        if exc is None:
            self._done = True
        else:
            self._exc = exc
        on_end = self._on_end
        if on_end is not None:
            self._on_data = self._on_end = None
            on_end(exc)
        self._wake()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)
