"""One request the proxy's HTTP server (http_server.py) parsed, and the way a handler answers it.

request.respond(status, body[, content_type, headers])            # a whole answer, one write
request.begin_stream(status, content_type[, headers])             # a streamed one: the head waits for data
request.write(data) / transport.write(request.frame(data))        # its parts (chunks; as is for HTTP/1.0)
request.end_stream(last)                                          # its last part and its end, one write
"""

from __future__ import annotations

import asyncio
import time
from email.utils import formatdate
from typing import Protocol

import msgspec

from .errors import openai_error

REASONS = {
    100: "Continue",
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    413: "Content Too Large",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    499: "Client Closed Request",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
    505: "HTTP Version Not Supported",
}


class ClientConnection(Protocol):
    """What a request needs of the client connection it came on (http_server.Connection)."""

    transport: asyncio.Transport | None
    writing_paused: bool  # past the transport's high-water mark
    pending_head: bytes  # a streamed answer's head, sent with its first data

    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...


class Request:
    """One parsed request and the way to answer it. Header names are lower case; repeated ones are joined with
    ', ' (as RFC 9110 allows for list-valued fields)."""

    __slots__ = (
        "method",
        "path",
        "query",
        "version",
        "headers",
        "body",
        "keep_alive",
        "conn",
        "started",
        "done",
        "chunked",
    )

    def __init__(
        self,
        conn: ClientConnection,
        method: str,
        path: str,
        query: str,
        version: str,
        headers: dict[str, str],
        body: bytes,
        keep_alive: bool,
    ):
        self.conn, self.method, self.path, self.query, self.version = conn, method, path, query, version
        self.headers, self.body, self.keep_alive = headers, body, keep_alive
        self.started = False  # the status line is sent
        self.done = False  # the whole answer is sent
        self.chunked = version == "1.1"  # a streamed answer to HTTP/1.0 goes unframed, until close

    @property
    def transport(self) -> asyncio.Transport | None:
        return self.conn.transport

    @property
    def writing_paused(self) -> bool:
        """The client's transport is past its high-water mark: stop writing until drain()."""
        return self.conn.writing_paused

    async def drain(self) -> None:
        await self.conn.drain()

    def respond(
        self, status: int, body: bytes, content_type: str = "application/json", headers: dict[str, str] | None = None
    ) -> None:
        """The whole answer in one write."""
        assert not self.started, "the answer has begun already"
        self.started = self.done = True
        head = self._head(status, content_type, headers) + b"Content-Length: %d\r\n\r\n" % len(body)
        self.conn.write(head + body if self.method != "HEAD" else head)

    def begin_stream(self, status: int, content_type: str, headers: dict[str, str] | None = None) -> None:
        """Start a streamed answer; its head leaves with the first data (write or end_stream)."""
        assert not self.started, "the answer has begun already"
        self.started = True
        if not self.chunked:
            self.keep_alive = False  # HTTP/1.0: the body ends when the connection does
        framing = b"Transfer-Encoding: chunked\r\n\r\n" if self.chunked else b"\r\n"
        self.conn.pending_head = self._head(status, content_type, headers) + framing

    def frame(self, data: bytes) -> bytes:
        """`data` as it goes on the wire in a streamed answer (a chunk, or as it is for HTTP/1.0)."""
        return b"%x\r\n%b\r\n" % (len(data), data) if self.chunked else data

    def write(self, data: bytes) -> None:
        """Part of a streamed answer (nothing for empty data but the head, when it is still pending)."""
        conn = self.conn
        out = self.frame(data) if data else b""
        if conn.pending_head:
            out, conn.pending_head = conn.pending_head + out, b""
        if out:
            conn.write(out)

    def end_stream(self, last: bytes = b"") -> None:
        """The last part of a streamed answer and its end, in one write."""
        if self.done:
            return
        self.done = True
        conn = self.conn
        out = self.frame(last) if last else b""
        if self.chunked:
            out += b"0\r\n\r\n"
        if conn.pending_head:
            out, conn.pending_head = conn.pending_head + out, b""
        if out:
            conn.write(out)

    def _head(self, status: int, content_type: str, headers: dict[str, str] | None) -> bytes:
        lines = [
            f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}\r\nServer: hybrid-pd\r\nDate: {_date()}\r\n"
            f"Content-Type: {content_type}\r\n"
        ]
        if headers:
            lines.extend(f"{k}: {v}\r\n" for k, v in headers.items())
        if not self.keep_alive:
            lines.append("Connection: close\r\n")
        elif self.version == "1.0":
            lines.append("Connection: keep-alive\r\n")
        return "".join(lines).encode("latin-1")


_date_cache: tuple[int, str] = (0, "")


def _date() -> str:
    global _date_cache
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache = (now, formatdate(now, usegmt=True))
    return _date_cache[1]


def error_body(status: int, type_: str, message: str) -> bytes:
    return msgspec.json.encode(openai_error(message, type_, None, status))
