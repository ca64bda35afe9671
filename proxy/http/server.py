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
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from .head_with_body import HeadWithBody
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
        self.cycle.transport = HeadWithBody(self.transport, self.flow, self.cycle)  # type: ignore[assignment]  # (what the cycle uses of one)
        if self.parser.should_upgrade():  # served, then closed: llhttp reads nothing after an upgrade request
            self.cycle.keep_alive = False

    def on_response_complete(self) -> None:
        cycle = self.cycle
        if cycle is not None and isinstance(cycle.transport, HeadWithBody):
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
            conn=cycle.transport,  # (a HeadWithBody: write_now)
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
