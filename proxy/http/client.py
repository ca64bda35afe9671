"""A lean HTTP/1.1 client for the proxy's calls to its workers (tokenize, prefill, decode, health, models).

    pool = HTTPPool(connect_timeout=5.0)
    resp = await pool.request("POST", "http://p:8100", "/v1/completions", body, headers, timeout=30.0)
    data = await resp.read()            # or readany(): see response.py

Why not aiohttp's client: per request it builds a ClientRequest, a payload object, a connector key, timer
contexts and a StreamReader that wakes a coroutine per SSE event; profiled under load that was a third of the
proxy's CPU. Here one asyncio.Protocol per keep-alive connection parses the answer with llhttp (httptools'
response parser: content-length, chunked, or until close; a repeated Content-Length, a bare CR or a malformed
chunk is refused) straight into its Response (response.py), and the connection goes back to the pool as soon as
the answer's last byte arrived (its body stays buffered in the Response). Repeated header fields are joined with
', '. Heads over MAX_HEAD and bodies over MAX_BODY bytes are refused.

A request that meets a pooled connection the worker closed before a byte of the answer came is sent once more on
a new connection, a POST too: a server closes a keep-alive connection only while no request is in progress on it
(uvicorn, which vLLM runs, cancels its idle timer as the first byte of a request arrives), so the worker never
began the request; and the pool drops connections idle for keepalive_s, under uvicorn's 5 s.

Errors are the client's own (errors.py, mapped in upstream.py): ConnectFailed (cannot connect), Disconnected
(closed before an answer), BrokenAnswer (closed or garbled mid-body), and TimeoutError (no answer head within
`timeout`, or no data within readany's).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from urllib.parse import urlsplit

import httptools

from ..errors import BrokenAnswer, ConnectFailed, Disconnected
from ..timers import expire
from .response import Leave, Response

MAX_HEAD = 64 * 1024
MAX_BODY = 1 << 30  # a worker's answer, whole or streamed


class _Connection(asyncio.Protocol):
    def __init__(self, pool: HTTPPool, key: tuple[str, str, int], loop: asyncio.AbstractEventLoop):
        self.pool, self.key, self.loop = pool, key, loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reused = False  # served an answer before: a close before the next answer's head may be retried
        self.idle_since = 0.0
        self.parser = httptools.HttpResponseParser(self)
        self._head: asyncio.Future | None = None  # the current request's Response, once its head is parsed
        self._resp: Response | None = None
        self._headers: dict[str, str] = {}
        self._head_bytes = 0
        self._body_bytes = 0
        self._until_close = False  # a body without length or chunks: it ends when the connection does
        self._got_bytes = False  # some of the current answer arrived (a close is no longer a stale connection)
        self._paused = False
        self._left_behind: Leave | None = None  # the answer in progress was left behind by its caller
        # The head's deadline (loop time; None once its caller stopped waiting), checked by one timer per
        # connection, armed for the earliest deadline still to come, instead of a timer armed and cancelled per
        # request (about 1.8 us each on uvloop; deadlines of one connection's requests mostly come later and later)
        self.head_deadline: float | None = None
        self._watch: asyncio.TimerHandle | None = None
        self._watch_at = 0.0

    # ---- the client side ---------------------------------------------------------------------------------
    def send(self, data: bytes, deadline: float) -> asyncio.Future:
        """Send a request; the returned future gets its Response once the head arrived, or TimeoutError at
        `deadline` (a loop time) unless head_deadline was cleared before."""
        self._head = fut = self.loop.create_future()
        self._resp, self._got_bytes = None, False
        self.head_deadline = deadline
        if self._watch is None or self._watch_at > deadline:
            self._watch_until(deadline)
        self.transport.write(data)  # type: ignore[union-attr]  # (set before the pool hands it out)
        return fut

    def _watch_until(self, deadline: float) -> None:
        if self._watch is not None:
            self._watch.cancel()
        self._watch, self._watch_at = self.loop.call_at(deadline, self._check_deadline), deadline

    def _check_deadline(self) -> None:
        self._watch = None
        deadline, head = self.head_deadline, self._head
        if deadline is None or head is None or head.done() or self.closed:
            return
        if self.loop.time() + 0.001 >= deadline:  # (uvloop's clock and timers count milliseconds)
            expire(head)
        else:
            self._watch_until(deadline)

    def abort(self) -> None:
        if not self.closed:
            self.closed = True
            self.transport.abort()  # type: ignore[union-attr]  # (set before the pool hands it out)

    def leave(self, head: asyncio.Future | None, resp: Response | None, leave: Leave) -> None:
        """The caller of the answer whose head future is `head` (or whose Response is `resp`) stops waiting."""
        in_progress = self._head is head if resp is None else (self._resp is resp and not resp.complete)
        if self.closed or not in_progress:
            return  # nothing left to read: the answer is complete (and pooled) or the connection is gone
        leave.taken = True
        self._left_behind = leave
        self.loop.call_at(leave.until, self._drop_left, leave)

    def _drop_left(self, leave: Leave) -> None:
        if self._left_behind is leave:
            self.abort()

    def _left_done(self) -> None:
        leave, self._left_behind = self._left_behind, None
        if leave is not None:
            leave.on_end()

    def pause(self) -> None:
        if not self._paused and not self.closed:
            self._paused = True
            self.transport.pause_reading()  # type: ignore[union-attr]  # (set before the pool hands it out)

    def resume(self) -> None:
        if self._paused and not self.closed:
            self._paused = False
            self.transport.resume_reading()  # type: ignore[union-attr]  # (set before the pool hands it out)

    # ---- asyncio.Protocol --------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # (a TCP connection's is an asyncio.Transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        resp = self._resp
        if resp is not None:
            if self._until_close and exc is None:
                resp._finish()
            elif not resp._done:
                resp._finish(BrokenAnswer(f"the worker closed the connection mid-body ({exc!r})"))
        elif self._head is not None and not self._head.done():
            self._head.set_exception(Disconnected(retryable=self.reused and not self._got_bytes))
        self._resp = None
        self._left_done()

    def data_received(self, data: bytes) -> None:
        self._got_bytes = True
        try:
            self.parser.feed_data(data)
            if self._resp is not None:  # the answer goes on: a piping reader takes this read's bytes now
                self._resp._to_sink()
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as e:
            cause = e.__context__ if isinstance(e.__context__, BrokenAnswer) else None
            err = cause or BrokenAnswer(f"malformed HTTP answer from the worker: {e}")
            if self._resp is not None:
                self._resp._finish(err)
            elif self._head is not None and not self._head.done():
                self._head.set_exception(err)
            self._resp = None
            self.abort()

    # ---- llhttp callbacks ----------------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        if self._head is None:
            raise BrokenAnswer("the worker answered a request it was not sent")
        self._headers, self._head_bytes, self._body_bytes = {}, 0, 0

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_bytes += len(name) + len(value)
        if self._head_bytes > MAX_HEAD:
            raise BrokenAnswer(f"answer head over {MAX_HEAD} bytes")
        key, text = name.decode("latin-1").lower(), value.decode("latin-1")
        old = self._headers.get(key)  # (llhttp refuses a second Content-Length itself)
        self._headers[key] = text if old is None else f"{old}, {text}"

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if status < 200:
            return  # 100 Continue and friends: the real answer follows
        headers = self._headers
        self._until_close = (
            status not in (204, 304)
            and "content-length" not in headers
            and "chunked" not in headers.get("transfer-encoding", "").lower()
        )
        self._resp = resp = Response(self, status, headers)
        if self._head is not None and not self._head.done():
            self._head.set_result(resp)

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        if self._body_bytes > MAX_BODY:
            raise BrokenAnswer(f"answer body over {MAX_BODY} bytes")
        assert self._resp is not None  # (a body follows its head)
        self._resp._feed(body)

    def on_message_complete(self) -> None:
        resp = self._resp
        if resp is None:
            return  # the end of a 1xx answer
        self._resp = self._head = None
        self.resume()  # (its Response may have paused reading; the next answer on this connection reads on)
        if self.parser.should_keep_alive() and not self._until_close:
            self.reused = True
            self.pool._release(self)
        else:
            self.abort()
        resp._finish()
        self._left_done()


class HTTPPool:
    """Keep-alive connections per worker (no limit: admission bounds the requests in flight)."""

    def __init__(self, connect_timeout: float, keepalive_s: float = 4.0):
        # Idle connections are dropped after keepalive_s, under uvicorn's (vLLM's) 5 s idle timeout, so that
        # a request seldom meets a connection the worker is closing.
        self.connect_timeout, self.keepalive_s = connect_timeout, keepalive_s
        self._idle: dict[tuple[str, str, int], deque[_Connection]] = {}
        self._keys: dict[str, tuple[tuple[str, str, int], str]] = {}
        self._ssl: ssl.SSLContext | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    async def request(
        self,
        method: str,
        base: str,
        path: str,
        body: bytes | None,
        headers: dict[str, str] | None,
        *,
        timeout: float,
        leave: Leave | None = None,
    ) -> Response:
        """Send the request; return the Response once its status line and headers arrived within `timeout`.
        A caller cancelled or timed out drops the connection, or, with `leave`, leaves the answer behind."""
        loop = self.loop
        if loop is None:  # a pool serves one loop (its connections are that loop's transports)
            loop = self.loop = asyncio.get_running_loop()  # once: on Python 3.11 each call is a getpid
        deadline = loop.time() + timeout
        key, host_header = self._key(base)
        head = [f"{method} {path} HTTP/1.1\r\nHost: ", host_header]
        for name, value in (headers or {}).items():
            head.append(f"\r\n{name}: {value}")
        if body is not None:
            head.append(f"\r\nContent-Length: {len(body)}")
        data = "".join(head).encode("utf-8", "surrogateescape")
        if b"\n" in data.replace(b"\r\n", b""):
            raise ValueError("a header contains a line break")
        data += b"\r\n\r\n" + body if body is not None else b"\r\n\r\n"
        for _ in (0, 1):
            conn = self._idle_one(key) or await self._connect(loop, key, deadline)
            fut = conn.send(data, deadline)
            try:
                return await fut
            except Disconnected as e:
                if not e.retryable:
                    raise  # a reused connection the worker closed before reading: try once on a fresh one
            except BaseException:
                if leave is None:
                    conn.abort()
                else:
                    conn.leave(fut, None, leave)
                raise
            finally:
                conn.head_deadline = None
        raise Disconnected()  # pragma: no cover - the loop returns or raises

    def idle_count(self, base: str) -> int:
        """Idle keep-alive connections to `base` (an answer left behind goes back here once read)."""
        return sum(not c.closed for c in self._idle.get(self._key(base)[0], ()))

    def close(self) -> None:
        for idle in self._idle.values():
            while idle:
                idle.pop().abort()

    def _key(self, base: str) -> tuple[tuple[str, str, int], str]:
        """((scheme, host, port), the Host header) of a base URL."""
        key = self._keys.get(base)
        if key is None:
            u = urlsplit(base)
            port = u.port or (443 if u.scheme == "https" else 80)
            key = self._keys[base] = ((u.scheme, u.hostname or "", port), u.netloc)
        return key

    def _idle_one(self, key: tuple[str, str, int]) -> _Connection | None:
        """A pooled connection still open and fresh (the usual case: no coroutine for it), else None."""
        idle = self._idle.get(key)
        if not idle:
            return None
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < self.keepalive_s:
                return conn
            conn.abort()
        return None

    async def _connect(
        self, loop: asyncio.AbstractEventLoop, key: tuple[str, str, int], deadline: float
    ) -> _Connection:
        scheme, host, port = key
        if scheme == "https" and self._ssl is None:
            self._ssl = ssl.create_default_context()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _Connection(self, key, loop), host, port, ssl=self._ssl if scheme == "https" else None
                ),
                max(0.0, min(self.connect_timeout, deadline - loop.time())),
            )
        except OSError as e:
            raise ConnectFailed(f"cannot connect to {host}:{port}: {e}") from None
        return conn

    def _release(self, conn: _Connection) -> None:
        conn.idle_since = time.monotonic()
        self._idle.setdefault(conn.key, deque()).append(conn)
