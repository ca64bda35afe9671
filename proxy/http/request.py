"""One request the proxy's HTTP server (server.py) received, and the way a handler answers it (ASGI underneath).

    await request.respond(status, body[, content_type, headers])     # a whole answer
    request.begin_stream(status, content_type[, headers])            # a streamed one: its head waits for data
    await request.write(data)                                        # a part (waits while the client lags)
    conn = request.writer()                                          # or a part at once, without awaiting:
    if conn.can_write_now(): conn.write_now(data)                    #   (from a callback; None: write() only)
    await request.end_stream(last)                                   # its last part and its end

A client that leaves cancels the handler (server.py) after setting `client_gone`, so a handler can tell that
from the proxy stopping. An HTTP/1.0 client cannot read chunks: its streamed answer is sent whole at its end.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import msgspec

from ..errors import openai_error

Send = Callable[[dict[str, Any]], Awaitable[None]]


class Connection(Protocol):
    """The client's connection (server.py's): Request.writer gives it out for a stream's middle parts, and
    Request.respond writes a whole answer through it where it can (respond_now)."""

    def can_write_now(self) -> bool: ...

    def write_now(self, data: bytes) -> None: ...

    def respond_now(self, status: int, content_type: str, body: bytes, close: bool) -> bool: ...


class Request:
    """One received request and the way to answer it. Header names are lower case; repeated ones are joined
    with ', ' (as RFC 9110 allows for list-valued fields)."""

    __slots__ = (
        "method",
        "path",
        "query",
        "version",
        "headers",
        "body",
        "close",
        "started",
        "done",
        "client_gone",
        "_send",
        "_conn",
        "_head",
        "_held",
    )

    def __init__(
        self,
        send: Send,
        method: str,
        path: str,
        query: str,
        version: str,
        headers: dict[str, str],
        body: bytes,
        close: bool = False,
        conn: Connection | None = None,
    ):
        self.method, self.path, self.query, self.version = method, path, query, version
        self.headers, self.body, self._send, self._conn = headers, body, send, conn
        self.close = close  # answer with Connection: close (the server drains)
        self.started = False  # the answer has begun (its head may still wait for data)
        self.done = False  # the whole answer is handed to the server
        self.client_gone = False  # the client closed its connection
        self._head: dict[str, Any] | None = None  # a streamed answer's head, sent with its first data
        self._held: list[bytes] | None = None  # a streamed answer to an HTTP/1.0 client, sent whole at its end

    async def respond(
        self, status: int, body: bytes, content_type: str = "application/json", headers: dict[str, str] | None = None
    ) -> None:
        """The whole answer."""
        assert not self.started, "the answer has begun already"
        self.started = self.done = True
        conn = self._conn
        if conn is not None and not headers and conn.respond_now(status, content_type, body, self.close):
            return  # (written at once, as the server's send would write it)
        await self._send(self._start(status, content_type, headers, len(body)))
        await self._send({"type": "http.response.body", "body": body})

    def begin_stream(self, status: int, content_type: str, headers: dict[str, str] | None = None) -> None:
        """Start a streamed answer; its head leaves with the first data (write or end_stream)."""
        assert not self.started, "the answer has begun already"
        self.started = True
        if self.version == "1.0":
            self._held = []
        self._head = self._start(status, content_type, headers, None)

    async def write(self, data: bytes) -> None:
        """Part of a streamed answer; returns once the client's buffer is below its high-water mark."""
        if self._held is not None:
            self._held.append(data)
            return
        if self._head is not None:
            head, self._head = self._head, None
            await self._send(head)
        if data:
            await self._send({"type": "http.response.body", "body": data, "more_body": True})

    def writer(self) -> Connection | None:
        """The client's connection, for the middle parts of this streamed answer (its first part written) where
        they are written from a callback that cannot await (a relay in the decoder connection's): ask its
        can_write_now() before each write_now(data), and leave a part it refuses to write(), which waits for
        the client. None where write() must take every part (an HTTP/1.0 answer, one not in its middle)."""
        if not self.started or self._head is not None or self.done or self._held is not None:
            return None
        return self._conn

    async def end_stream(self, last: bytes = b"") -> None:
        """The last part of a streamed answer and its end."""
        if self.done:
            return
        self.done = True
        if self._held is not None:
            body = b"".join([*self._held, last])
            assert self._head is not None
            self._head["headers"].append((b"content-length", b"%d" % len(body)))
            self._held = None
        else:
            body = last
        if self._head is not None:
            head, self._head = self._head, None
            await self._send(head)
        await self._send({"type": "http.response.body", "body": body})

    def _start(
        self, status: int, content_type: str, headers: dict[str, str] | None, length: int | None
    ) -> dict[str, Any]:
        head = [(b"content-type", content_type.encode("latin-1"))]
        if length is not None:
            head.append((b"content-length", b"%d" % length))
        if headers:
            head.extend((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items())
        if self.close:
            head.append((b"connection", b"close"))
        return {"type": "http.response.start", "status": status, "headers": head}


def error_body(status: int, type_: str, message: str) -> bytes:
    return msgspec.json.encode(openai_error(message, type_, None, status))
