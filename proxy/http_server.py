"""The proxy's HTTP/1.1 server: one asyncio.Protocol per client connection, llhttp (httptools) for parsing.

    server = await HTTPServer.start(host, port, handler, limits)   # handler(request) -> Awaitable[None]
    ...
    server.draining = True          # answers say Connection: close (clients reconnect, elsewhere)
    server.stop_accepting()         # the listener closes; idle connections close, busy ones after their answer
    await server.wait_idle(timeout_s)
    await server.stop(grace_s)      # what is still open gets grace_s, then is cancelled

A handler answers through its request (http_request.Request: a whole answer, or a streamed one). What it leaves
unanswered gets a 500 (or, mid-stream, the connection is closed). A client that closes its connection cancels
the request's handler (that is what aborts the decode leg). Requests on one connection are answered in order
(pipelining); a request body may come with Content-Length or chunked, after `Expect: 100-continue` too.

Why not aiohttp's server: for a bare JSON answer it spends 405 us of CPU per request where this one spends 235
(requests 2 ms apart, each meeting a cold path, as at a decoder's pace; 156 vs 92 us back to back): its request
object, router, middleware chain, response object and writer per request were the largest cost left on the
proxy's request path (tests/bench/server_bench.py; tests/bench/results/proxy.md, run 5).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httptools

from .http_request import REASONS, Request, error_body

log = logging.getLogger("hybrid_pd.proxy")

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 64 * 1024 * 1024  # long-context prompts as text or token ids
    max_head_bytes: int = 64 * 1024  # request line + headers
    max_headers: int = 128
    idle_s: float = 75.0  # a connection without a request in progress is closed after this long
    max_pipelined: int = 16  # parsed requests waiting their turn before reading pauses


Handler = Callable[["Request"], Awaitable[None]]


class RequestRejected(Exception):
    """A request the parser cannot take (too large, malformed): answered with `status`, then the connection
    closes (the parser's position in the byte stream is lost)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


class Connection(asyncio.Protocol):
    """One client connection: parses requests as they arrive, answers them one at a time, in order."""

    def __init__(self, server: HTTPServer):
        self.server, self.limits, self.loop = server, server.limits, server.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.writing_paused = False
        self.pending_head = b""
        self.current: Request | None = None  # the request being answered
        self.task: asyncio.Task | None = None
        self.idle_since = time.monotonic()
        self._queue: deque[Request] = deque()
        self._drain: asyncio.Future | None = None
        self._closing = False  # no request after the current one (Connection: close, an error, shutdown)
        self._url = b""
        self._headers: dict[str, str] = {}
        self._head_bytes = 0
        self._body: list[bytes] = []
        self._body_bytes = 0
        self._paused_reading = False

    # ---- asyncio.Protocol ----------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # (a TCP connection's is an asyncio.Transport)
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self.transport = None
        self._closing = True
        self._queue.clear()
        if self.task is not None and not self.task.done():
            self.task.cancel()  # the client left: its handler stops (and with it the calls to the workers)
        self._wake_drain()

    def eof_received(self) -> None:
        return None  # a client that stops sending has gone: close (this cancels a request in progress)

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        self._wake_drain()

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._closing = True  # no protocol switch here: what follows the request is not HTTP/1.1
            last = self._queue[-1] if self._queue else self.current
            if last is not None and not last.started:
                last.keep_alive = False  # its answer says Connection: close
        except httptools.HttpParserError as e:
            rejected = e.__context__ if isinstance(e.__context__, RequestRejected) else None
            self._reject(rejected or RequestRejected(400, f"malformed HTTP request: {e}"))

    # ---- llhttp callbacks ----------------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._url, self._headers, self._head_bytes = b"", {}, 0
        self._body, self._body_bytes = [], 0

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._count_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value))
        if len(self._headers) >= self.limits.max_headers:
            raise RequestRejected(431, f"more than {self.limits.max_headers} header fields")
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        old = self._headers.get(key)
        self._headers[key] = text if old is None else f"{old}, {text}"

    def on_headers_complete(self) -> None:
        if self.parser.should_upgrade() and (
            self._headers.get("content-length", "0") != "0" or "transfer-encoding" in self._headers
        ):
            # llhttp would hand over the request without its body (what follows an upgrade is not HTTP/1.1)
            raise RequestRejected(
                400,
                "protocol upgrades are not supported: send the request without an "
                "Upgrade header (e.g. curl without --http2 on http://)",
            )
        length = self._headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.limits.max_body_bytes:
            raise RequestRejected(413, f"the request body is over {self.limits.max_body_bytes} bytes")
        if (
            self._headers.get("expect", "").lower() == "100-continue"
            and self.parser.get_http_version() == "1.1"
            and self.current is None
            and not self._queue
            and self.transport is not None
        ):
            self.transport.write(CONTINUE)  # (a pipelined one waits: its 100 would land inside another answer)

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        if self._body_bytes > self.limits.max_body_bytes:
            raise RequestRejected(413, f"the request body is over {self.limits.max_body_bytes} bytes")
        self._body.append(body)

    def on_message_complete(self) -> None:
        try:
            url = httptools.parse_url(self._url) if self._url[:1] == b"/" else None
        except httptools.HttpParserInvalidURLError:
            url = None
        if url is None:
            raise RequestRejected(400, "the request target must be a path")
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        req = Request(
            self,
            self.parser.get_method().decode("ascii"),
            url.path.decode("latin-1"),
            (url.query or b"").decode("latin-1"),
            self.parser.get_http_version(),
            self._headers,
            body,
            self.parser.should_keep_alive() and not self.server.draining,
        )
        self._headers, self._body = {}, []
        if self.current is None:
            self._start(req)
        else:
            self._queue.append(req)
            if len(self._queue) >= self.limits.max_pipelined and self.transport is not None:
                self.transport.pause_reading()
                self._paused_reading = True

    # ---- answering -----------------------------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():  # (a closed transport raises on write)
            transport.write(data)

    async def drain(self) -> None:
        """Returns once the client's buffer is below its low-water mark; ConnectionResetError once it is gone."""
        while self.writing_paused and self.transport is not None:
            self._drain = self._drain or self.loop.create_future()
            await self._drain
        if self.transport is None:
            raise ConnectionResetError("the client closed its connection")

    def _start(self, req: Request) -> None:
        self.current = req
        self.task = self.loop.create_task(self._serve(req))

    async def _serve(self, req: Request) -> None:
        try:
            await self.server.handler(req)
        except asyncio.CancelledError:
            pass  # the client left, or the server stops
        except Exception:  # the handler's own boundary answers errors; this is the last line
            log.exception("unhandled error on %s %s", req.method, req.path)
            if not req.started:
                req.respond(500, error_body(500, "internal_error", "internal proxy error"))
        finally:
            self._finish(req)

    def _finish(self, req: Request) -> None:
        self.current = self.task = None
        if self.transport is None:
            return
        if not req.done:  # a handler that left its answer unfinished: the client cannot tell where it ends
            if self.server.stopping and not req.started:
                req.keep_alive = False
                req.respond(503, error_body(503, "service_unavailable", "the proxy is shutting down; retry"))
            elif not req.started:
                req.respond(500, error_body(500, "internal_error", "the proxy gave no answer"))
            else:
                self.transport.close()
                return
        if not req.keep_alive or self._closing:
            self.transport.close()
            return
        self.idle_since = time.monotonic()
        if self._queue:
            self._start(self._queue.popleft())
        if self._paused_reading and len(self._queue) < self.limits.max_pipelined:
            self._paused_reading = False
            self.transport.resume_reading()

    def _reject(self, err: RequestRejected) -> None:
        """Answer what could not be parsed (after the answer in progress, which the client is owed first) and
        close: the parser lost its place in the stream."""
        self._closing = True
        self._queue.clear()
        if self.transport is None:
            return
        if self.current is None:
            body = error_body(err.status, "invalid_request_error", err.message)
            self.transport.write(
                b"HTTP/1.1 %d %b\r\nServer: hybrid-pd\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\nConnection: close\r\n\r\n%b"
                % (err.status, REASONS.get(err.status, "Error").encode(), len(body), body)
            )
            self.transport.close()

    def _count_head(self, n: int) -> None:
        self._head_bytes += n
        if self._head_bytes > self.limits.max_head_bytes:
            raise RequestRejected(431, f"the request head is over {self.limits.max_head_bytes} bytes")

    def _wake_drain(self) -> None:
        fut, self._drain = self._drain, None
        if fut is not None and not fut.done():
            fut.set_result(None)

    def close_if_idle(self, now: float) -> bool:
        if self.current is None and self.transport is not None and now - self.idle_since > self.limits.idle_s:
            self.transport.close()
            return True
        return False


class HTTPServer:
    def __init__(self, loop: asyncio.AbstractEventLoop, handler: Handler, limits: Limits):
        self.loop, self.handler, self.limits = loop, handler, limits
        self.connections: set[Connection] = set()
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self.draining = False  # answers say Connection: close
        self.stopping = False  # the listener is closed

    @classmethod
    async def start(cls, host: str, port: int, handler: Handler, limits: Limits = Limits()) -> HTTPServer:
        loop = asyncio.get_running_loop()
        self = cls(loop, handler, limits)
        self._server = await loop.create_server(lambda: Connection(self), host, port, reuse_address=True)
        self._sweep()
        return self

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.sockets[0].getsockname()[1]

    def stop_accepting(self) -> None:
        """Close the listener (new connections are refused) and idle connections; a connection with a request
        in progress closes after its answer."""
        self.stopping = self.draining = True
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn._closing = True
            if conn.current is None and conn.transport is not None:
                conn.transport.close()

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no request is in progress (True), or `timeout_s` passed (False)."""
        tasks = [c.task for c in self.connections if c.task is not None]
        if not tasks:
            return True
        _, pending = await asyncio.wait(tasks, timeout=timeout_s)
        return not pending

    async def stop(self, grace_s: float = 1.0) -> None:
        """Stop accepting; give requests in progress `grace_s` seconds, then cancel them (one not answered yet
        gets a 503, a stream its handler's last words) and close every connection."""
        self.stop_accepting()
        if not await self.wait_idle(grace_s):
            pending = [c.task for c in self.connections if c.task is not None]
            for task in pending:
                task.cancel()
            await asyncio.wait(pending, timeout=1.0)  # they write their last words (a 503, an SSE error event)
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.close()  # after what is buffered is sent
        if self._server is not None:
            await self._server.wait_closed()

    def _sweep(self) -> None:
        """Close idle keep-alive connections (and heads that trickle in for longer than the idle limit)."""
        now = time.monotonic()
        for conn in list(self.connections):
            conn.close_if_idle(now)
        self._sweeper = self.loop.call_later(min(10.0, self.limits.idle_s / 2), self._sweep)
