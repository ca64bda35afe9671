"""The proxy's HTTP/1.1 server: uvicorn's httptools protocol (llhttp) and one handler, called with a Request.

    server = await HTTPServer.start(host, port, handler, limits)   # handler(request) -> Awaitable[None]
    ...
    server.draining = True          # answers say Connection: close (clients reconnect, elsewhere)
    server.stop_accepting()         # the listener closes; idle connections close, busy ones after their answer
    await server.wait_idle(timeout_s)
    await server.stop(grace_s)      # what is still open gets grace_s, then is cancelled (unanswered: a 503)

A handler answers through its request (request.Request: a whole answer, or a streamed one); what it leaves
unanswered gets a 500 (or, mid-stream, the connection is closed). A client that closes its connection cancels
the request's handler (that is what aborts the decode leg). uvicorn answers requests on one connection in order
(pipelining), takes bodies with Content-Length or chunked, after `Expect: 100-continue` too, and closes
connections idle for `Limits.idle_s`. What it leaves open is closed here: the size of a request's head and body,
a head that trickles in for longer than the idle limit, and 4xx answers in OpenAI's error shape.

Why uvicorn and not our own server (which this replaced): measured alone at a decoder's pace, ours spent 0.89x of
uvicorn's CPU per request on an SSE stream and 0.80x / 1.00x on JSON answers (run 6 of
benchmarks/results/2026-11-24-cpu-proxy-server/summary.md): not the 15% a server of our own must save to be kept.
aiohttp's servers and granian spent more.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from email.utils import formatdate
from typing import Any, cast

import uvicorn
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HEADER_VALUE_RE, STATUS_LINE, HttpToolsProtocol, RequestResponseCycle

from .request import Request, error_body

log = logging.getLogger("hybrid_pd.proxy")

Handler = Callable[[Request], Awaitable[None]]


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 64 * 1024 * 1024  # long-context prompts as text or token ids
    max_head_bytes: int = 64 * 1024  # request line + headers
    max_headers: int = 128
    idle_s: float = 75.0  # a keep-alive connection without a request, or a head not complete, is closed after this


class _Rejected(Exception):
    """A request the server does not take (too large, malformed): answered with `status`, then the connection
    closes (the parser's position in the byte stream is lost)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


_REASONS = {400: b"Bad Request", 408: b"Request Timeout", 413: b"Content Too Large", 431: b"Fields Too Large"}


class _Protocol(HttpToolsProtocol):
    """uvicorn's protocol with what a public endpoint needs beside it: caps on a request's head and body, a
    deadline for its head, and 4xx answers in OpenAI's error shape instead of uvicorn's plain text."""

    def __init__(self, *args: Any, limits: Limits, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.limits = limits
        self._head_bytes = 0
        self._body_bytes = 0
        self._rejected: _Rejected | None = None
        # One lazy timer per connection instead of one (or two) per request: the head's deadline and the keep-alive
        # idle limit are times noted here, and the timer, armed for the earliest one still to come, checks them
        # when it fires (a uvloop timer armed and cancelled costs about 1.8 us; two per request did before).
        self._head_since: float | None = None  # a request head in progress since (loop time)
        self._idle_since: float | None = None  # idle after an answer since (uvicorn's keep-alive timeout)
        self._watch: asyncio.TimerHandle | None = None
        self._watch_at = 0.0

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_since = self._idle_since = None
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        cycle = self.cycle
        super().connection_lost(exc)
        gone = getattr(cycle, "on_client_gone", None)
        if gone is not None and cycle.disconnected:
            gone()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = self._body_bytes = 0
        self._idle_since = None  # (uvicorn's data_received cancelled its keep-alive timer: there is none here)
        self._head_since = now = self.loop.time()
        self._watch_until(now + self.limits.idle_s)

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        self.url += url  # (uvicorn's on_url)

    def on_header(self, name: bytes, value: bytes) -> None:
        # (runs per header field: _count_head and uvicorn's on_header written out)
        self._head_bytes += len(name) + len(value)
        if self._head_bytes > self.limits.max_head_bytes:
            self._reject(431, f"the request head is over {self.limits.max_head_bytes} bytes")
        if len(self.headers) >= self.limits.max_headers:
            self._reject(431, f"more than {self.limits.max_headers} header fields")
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._head_since = None
        if self.url[:1] != b"/":
            self._reject(400, "the request target must be a path")
        fields = dict(self.headers)
        if self.parser.should_upgrade() and (
            fields.get(b"content-length", b"0") != b"0" or b"transfer-encoding" in fields
        ):
            # llhttp would hand over the request without its body (what follows an upgrade is not HTTP/1.1)
            self._reject(
                400,
                "protocol upgrades are not supported: send the request without an "
                "Upgrade header (e.g. curl without --http2 on http://)",
            )
        length = fields.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limits.max_body_bytes:
            self._reject(413, f"the request body is over {self.limits.max_body_bytes} bytes")
        super().on_headers_complete()
        self.cycle.transport = _HeadWithBody(self.transport, self.flow, self.cycle)  # type: ignore[assignment]  # (what the cycle uses of one)
        if self.parser.should_upgrade():  # served, then closed: llhttp reads nothing after an upgrade request
            self.cycle.keep_alive = False

    def on_response_complete(self) -> None:
        cycle = self.cycle
        if cycle is not None and isinstance(cycle.transport, _HeadWithBody):
            cycle.transport.flush()  # an answer without body bytes (to HEAD): its head alone
        # uvicorn's on_response_complete written out, its keep-alive timer made the connection's lazy one
        # (tests/proxy/test_uvicorn_compat.py checks that uvicorn's still reads so)
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self._unset_keepalive_if_required()
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        else:
            self._idle_since = now = self.loop.time()
            self._watch_until(now + self.timeout_keep_alive)

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        if self._body_bytes > self.limits.max_body_bytes:
            self._reject(413, f"the request body is over {self.limits.max_body_bytes} bytes")
        super().on_body(body)

    def send_400_response(self, msg: str) -> None:
        """uvicorn calls this for whatever the parser refused (and so for _reject's exceptions)."""
        rejected, self._rejected = self._rejected, None
        status, message = (rejected.status, rejected.message) if rejected else (400, "malformed HTTP request")
        body = error_body(status, "invalid_request_error", message)
        self.transport.write(
            b"HTTP/1.1 %d %b\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%b"
            % (status, _REASONS.get(status, b"Error"), len(body), body)
        )
        self.transport.close()

    def _reject(self, status: int, message: str) -> None:
        self._rejected = _Rejected(status, message)
        raise self._rejected  # llhttp stops; uvicorn's data_received answers through send_400_response

    def _count_head(self, n: int) -> None:
        self._head_bytes += n
        if self._head_bytes > self.limits.max_head_bytes:
            self._reject(431, f"the request head is over {self.limits.max_head_bytes} bytes")

    def _watch_until(self, deadline: float) -> None:
        """The connection's timer fires by `deadline` (re-armed only where it was set for later)."""
        if self._watch is not None:
            if self._watch_at <= deadline:
                return
            self._watch.cancel()
        self._watch, self._watch_at = self.loop.call_at(deadline, self._check_times), deadline

    def _check_times(self) -> None:
        """A head in progress for idle_s, or a connection idle for the keep-alive timeout, is closed; else the
        timer waits for whichever deadline is now due."""
        self._watch = None
        now = self.loop.time() + 0.001  # (uvloop's clock and timers count milliseconds)
        if self._head_since is not None:
            deadline, on_due = self._head_since + self.limits.idle_s, self._close_quietly
        elif self._idle_since is not None:
            deadline, on_due = self._idle_since + self.timeout_keep_alive, self.timeout_keep_alive_handler
        else:
            return  # busy with a request: the next head or idle spell arms it again
        if now >= deadline:
            on_due()
        else:
            self._watch_until(deadline)

    def _close_quietly(self) -> None:
        if not self.transport.is_closing():
            self.transport.close()


class _HeadWithBody:
    """The transport as one request's cycle sees it: uvicorn writes an answer's head alone and then its body,
    two system calls per answer; the head is held here until the first body bytes (or the end of the answer, or
    a close) and leaves with them in one write. A `100 Continue` goes out at once (the client waits for it).

    It also writes the middle parts of a chunked answer without the cycle (write_now): a relay at a decoder's
    pace hands each event over from the decoder connection's callback, where awaiting the cycle's `send` is not
    possible. The head and the last part still go through `send` (uvicorn's state of the answer: started,
    chunked, complete); a middle part changes none of it, and is framed as `send` frames one.

    And it writes a whole answer with a body of known length at once (respond_now), in the bytes `send` would
    write and with the cycle's state left as `send` leaves it, without the two `send` calls (coroutines, ASGI
    messages, two regular expressions per header field): the answer of every request that is not streamed."""

    __slots__ = ("transport", "flow", "cycle", "_head", "_held_once")
    CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"

    def __init__(self, transport: asyncio.Transport, flow: FlowControl, cycle: RequestResponseCycle):
        self.transport, self.flow = transport, flow
        self.cycle: RequestResponseCycle | None = cycle  # until the request's handler returns (server._asgi)
        self._head: bytes | None = None
        self._held_once = False

    def respond_now(self, status: int, content_type: str, body: bytes, close: bool) -> bool:
        """The whole answer in one write, as the cycle's `send` writes it (its default headers, content-type,
        content-length, `connection: close` where the connection ends), the cycle then complete. False where
        `send` must write it: the answer began, the client is gone or lags, the request is a HEAD, an access log."""
        cycle = self.cycle
        if (
            cycle is None  # (the request's handler has returned)
            or self._held_once
            or cycle.response_started
            or cycle.disconnected
            or self.flow.write_paused
            or cycle.access_log
            or cycle.scope["method"] == "HEAD"
        ):
            return False
        cycle.response_started = True
        cycle.waiting_for_100_continue = False
        parts = [STATUS_LINE[status], _default_fields(cycle.default_headers), _content_type_field(content_type)]
        parts.append(b"content-length: %d\r\n" % len(body))
        if close:
            cycle.keep_alive = False
        if not cycle.keep_alive:
            parts.append(b"connection: close\r\n")
        parts.append(b"\r\n")
        parts.append(body)
        cycle.chunked_encoding = False
        self._held_once = True
        self.transport.write(b"".join(parts))
        cycle.response_complete = True  # (what send does once the last body bytes are written)
        cycle.message_event.set()
        if not cycle.keep_alive:
            self.close()
        cycle.on_response()
        return True

    def can_write_now(self) -> bool:
        """write_now may write: the head left (it waits here for the first body bytes, which may come after
        Request.writer gave this out), the client keeps up (`send` would not wait) and is still there."""
        return self._head is None and not self.flow.write_paused and not self.transport.is_closing()

    def write_now(self, data: bytes) -> None:
        """One middle chunk of a chunked answer (only where can_write_now())."""
        self.transport.write(b"%x\r\n%b\r\n" % (len(data), data))

    def write(self, data: bytes) -> None:
        if not self._held_once and data != self.CONTINUE:
            self._held_once = True  # uvicorn's first write of an answer is its head
            self._head = data
            return
        if self._head is not None:
            data, self._head = self._head + data, None
        if data:
            self.transport.write(data)

    def flush(self) -> None:
        if self._head is not None:
            head, self._head = self._head, None
            self.transport.write(head)

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def is_closing(self) -> bool:
        return self.transport.is_closing()


_defaults: tuple[object, bytes] = (None, b"")  # server_state.default_headers (a list, replaced every second), written


def _default_fields(headers: list[tuple[bytes, bytes]]) -> bytes:
    global _defaults
    if _defaults[0] is not headers:
        _defaults = (headers, b"".join(b"%s: %s\r\n" % (name.lower(), value) for name, value in headers))
    return _defaults[1]


@functools.cache
def _content_type_field(content_type: str) -> bytes:
    value = content_type.encode("latin-1")
    if HEADER_VALUE_RE.search(value):  # (send's check; the proxy's content types are its own constants)
        raise RuntimeError("Invalid HTTP header value.")
    return b"content-type: %s\r\n" % value


class HTTPServer:
    def __init__(self, handler: Handler, limits: Limits):
        self.handler, self.limits = handler, limits
        self.draining = False  # answers say Connection: close
        self.stopping = False  # the listener is closed
        config = uvicorn.Config(
            self._asgi,
            http=cast(Any, functools.partial(_Protocol, limits=limits)),
            interface="asgi3",
            proxy_headers=False,  # (its middleware would rewrite the client's address from headers; unused)
            lifespan="off",
            log_config=None,
            access_log=False,
            timeout_keep_alive=int(max(1, limits.idle_s)),
            server_header=False,
            date_header=False,  # kept current by _date (uvicorn's own ticker wakes ten times a second)
        )
        config.load()
        self._uvicorn = uvicorn.Server(config)
        self._state = self._uvicorn.server_state
        self._date_timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    async def start(cls, host: str, port: int, handler: Handler, limits: Limits = Limits()) -> HTTPServer:
        self = cls(handler, limits)
        self._uvicorn.config.host, self._uvicorn.config.port = host, port
        self._uvicorn.lifespan = self._uvicorn.config.lifespan_class(self._uvicorn.config)
        self._loop = asyncio.get_running_loop()
        await self._uvicorn.startup()
        self._date()
        return self

    @property
    def port(self) -> int:
        return self._uvicorn.servers[0].sockets[0].getsockname()[1]

    @property
    def open_requests(self) -> int:
        return len(self._state.tasks)

    def stop_accepting(self) -> None:
        """Close the listener (new connections are refused) and idle connections; a connection with a request
        in progress closes after its answer."""
        self.stopping = self.draining = True
        for listener in self._uvicorn.servers:
            listener.close()
        for conn in list(self._state.connections):
            conn.shutdown()

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no request is in progress (True), or `timeout_s` passed (False)."""
        tasks = list(self._state.tasks)
        if not tasks:
            return True
        _, pending = await asyncio.wait(tasks, timeout=timeout_s)
        return not pending

    async def stop(self, grace_s: float = 1.0) -> None:
        """Stop accepting; give requests in progress `grace_s` seconds, then cancel them (one not answered yet
        gets a 503, a stream its handler's last words) and close every connection."""
        self.stop_accepting()
        if not await self.wait_idle(grace_s):
            pending = list(self._state.tasks)
            for task in pending:
                task.cancel()
            await asyncio.wait(pending, timeout=1.0)  # they write their last words (a 503, an SSE error event)
        for conn in list(self._state.connections):
            conn.transport.close()  # after what is buffered is sent
        for listener in self._uvicorn.servers:
            await listener.wait_closed()
        if self._date_timer is not None:
            self._date_timer.cancel()

    def _date(self) -> None:
        self._state.default_headers = [(b"date", formatdate(usegmt=True).encode()), (b"server", b"hybrid-pd")]
        self._date_timer = asyncio.get_running_loop().call_later(1.0, self._date)

    # ---- the ASGI application uvicorn calls -----------------------------------------------------------------
    async def _asgi(self, scope: dict[str, Any], receive: Callable[[], Awaitable[dict[str, Any]]], send: Any) -> None:
        cycle = receive.__self__  # type: ignore[attr-defined]  # uvicorn's RequestResponseCycle
        if not cycle.more_body and not cycle.waiting_for_100_continue and not cycle.disconnected:
            # the whole body came with the head (the usual case): receive()'s work without its coroutines
            chunks = [bytes(cycle.body)]
            cycle.body = bytearray()
            cycle.message_event.clear()
            cycle.flow.resume_reading()
        else:
            chunks = []
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    break
        headers: dict[str, str] = {}
        for raw_name, raw_value in scope["headers"]:
            name, value = raw_name.decode("latin-1"), raw_value.decode("latin-1")
            old = headers.get(name)
            headers[name] = value if old is None else f"{old}, {value}"
        if cycle.disconnected:
            return
        request = Request(
            send,
            scope["method"],
            scope["path"],
            scope["query_string"].decode("latin-1"),
            scope["http_version"],
            headers,
            chunks[0] if len(chunks) == 1 else b"".join(chunks),
            close=self.draining,
            conn=cycle.transport,  # (a _HeadWithBody: write_now)
        )
        task = asyncio.current_task(self._loop)  # (without the loop: a getpid per call on Python 3.11)
        assert task is not None
        # A client that leaves cancels the handler (that is what aborts the decode leg): the protocol's
        # connection_lost calls the cycle's on_client_gone (no watcher task per request).
        cycle.on_client_gone = functools.partial(_client_gone, request, task)
        try:
            await self.handler(request)
        except asyncio.CancelledError:
            if request.client_gone:  # (our own watcher's cancel: nothing to answer, and nobody else to tell)
                task.uncancel()
                return
            if not request.started:  # the server stops and the grace period passed
                request.close = True
                await request.respond(503, error_body(503, "service_unavailable", "the proxy is shutting down; retry"))
            raise
        except Exception:  # the handler's own boundary answers errors; this is the last line
            log.exception("unhandled error on %s %s", request.method, request.path)
            if not request.started:
                await request.respond(500, error_body(500, "internal_error", "internal proxy error"))
        finally:
            cycle.on_client_gone = None
            cycle.transport.cycle = None  # (cycle and transport refer to each other: no work left for the collector)
        if not request.started:
            await request.respond(500, error_body(500, "internal_error", "the proxy gave no answer"))


def _client_gone(request: Request, task: asyncio.Task) -> None:
    """The client's connection was lost while its handler was at work: cancel the handler."""
    if not request.done:
        request.client_gone = True
        task.cancel()
