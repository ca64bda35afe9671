"""The proxy's HTTP/1.1 server (proxy/http/server.py: uvicorn and what we add to it) on real sockets:
keep-alive, pipelining, request bodies (Content-Length, chunked, after 100-continue), HTTP/1.0, limits,
malformed input, disconnects, idle timeout, shutdown. Raw bytes go in and come out, so that framing is checked,
not a client's reading of it."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import aiohttp

from hybrid_pd.proxy.http.request import Request
from hybrid_pd.proxy.http.server import HTTPServer, Limits
from tests.proxy.fakes import run


class App:
    """Echoes what it parsed; a few paths misbehave on purpose."""

    def __init__(self) -> None:
        self.seen: list[Request] = []
        self.cancelled = asyncio.Event()
        self.release = asyncio.Event()
        self.active = 0
        self.max_active = 0

    async def __call__(self, req: Request) -> None:
        self.seen.append(req)
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            if req.path == "/slow":
                await asyncio.sleep(0.2)
            elif req.path == "/hang":
                try:
                    await self.release.wait()
                except asyncio.CancelledError:
                    self.cancelled.set()
                    raise
            elif req.path == "/boom":
                raise RuntimeError("handler bug")
            elif req.path == "/silent":
                return
            if req.path == "/stream":
                req.begin_stream(200, "text/event-stream")
                for i in range(3):
                    await req.write(b"data: %d\n\n" % i)
                    await asyncio.sleep(0)
                await req.end_stream(b"data: [DONE]\n\n")
                return
            body = json.dumps({"method": req.method, "path": req.path, "query": req.query, "version": req.version,
                               "body": req.body.decode("latin-1"), "headers": req.headers}).encode()
            await req.respond(200, body)
        finally:
            self.active -= 1


DEFAULT_LIMITS = Limits()


@contextlib.asynccontextmanager
async def server(limits: Limits = DEFAULT_LIMITS) -> AsyncIterator[tuple[App, int]]:
    app = App()
    srv = await HTTPServer.start("127.0.0.1", 0, app, limits)
    try:
        yield app, srv.port
    finally:
        app.release.set()
        await srv.stop(0.5)


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One answer off the wire: (status, headers, body), body by Content-Length, chunks or until close."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
    if "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding") == "chunked":
        body = b""
        while True:
            size = int((await reader.readuntil(b"\r\n"))[:-2], 16)
            chunk = await reader.readexactly(size + 2)
            assert chunk.endswith(b"\r\n")
            body += chunk[:-2]
            if size == 0:
                break
    else:
        body = await asyncio.wait_for(reader.read(), 5)
    return status, headers, body


async def connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


def post(path: str, body: bytes, extra: bytes = b"") -> bytes:
    return b"POST %b HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n%b\r\n%b" % (path.encode(), len(body), extra, body)


def test_keep_alive_and_pipelined_requests_are_answered_in_order_one_at_a_time():
    async def body():
        async with server() as (app, port):
            reader, writer = await connect(port)
            writer.write(post("/slow", b"one") + post("/fast?x=1", b"two"))  # pipelined: one write
            s1, _, b1 = await read_answer(reader)
            s2, _, b2 = await read_answer(reader)
            assert (s1, json.loads(b1)["body"]) == (200, "one")
            assert (s2, json.loads(b2)["body"], json.loads(b2)["query"]) == (200, "two", "x=1")
            assert app.max_active == 1  # the second waited for the first: answers cannot interleave
            writer.write(post("/again", b"three"))  # the same connection serves on
            s3, _, b3 = await read_answer(reader)
            assert json.loads(b3)["path"] == "/again"
            writer.close()
    run(body())


def test_chunked_request_body_and_repeated_headers():
    async def body():
        async with server() as (app, port):
            reader, writer = await connect(port)
            writer.write(b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nX-A: 1\r\nx-a: 2\r\n\r\n"
                         b"4\r\nwiki\r\n5;ext=1\r\npedia\r\n0\r\n\r\n")
            status, _, raw = await read_answer(reader)
            got = json.loads(raw)
            assert status == 200 and got["body"] == "wikipedia" and got["headers"]["x-a"] == "1, 2"
            writer.close()
    run(body())


def test_expect_100_continue_gets_its_interim_answer_before_the_body_is_sent():
    async def body():
        async with server() as (app, port):
            reader, writer = await connect(port)
            writer.write(b"POST /e HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
            interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
            writer.write(b"hello")
            status, _, raw = await read_answer(reader)
            assert status == 200 and json.loads(raw)["body"] == "hello"
            writer.close()
    run(body())


def test_http10_gets_answers_it_can_read_then_a_closed_connection():
    async def body():
        async with server() as (app, port):
            for path in (b"/a", b"/stream"):
                reader, writer = await connect(port)
                writer.write(b"GET %b HTTP/1.0\r\nConnection: keep-alive\r\n\r\n" % path)
                status, headers, raw = await read_answer(reader)
                assert status == 200 and headers["connection"] == "close"
                assert "transfer-encoding" not in headers  # no chunks for HTTP/1.0: a stream is sent whole
                if path == b"/stream":
                    assert raw == b"data: 0\n\ndata: 1\n\ndata: 2\n\ndata: [DONE]\n\n"
                assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the server
    run(body())


def test_streamed_answer_is_chunked_for_http11_and_read_by_a_real_client():
    async def body():
        async with server() as (app, port), aiohttp.ClientSession() as s:
            for _ in range(2):  # and the connection is reusable after it
                async with s.get(f"http://127.0.0.1:{port}/stream") as r:
                    assert r.headers["Transfer-Encoding"] == "chunked"
                    assert r.headers["Content-Type"] == "text/event-stream"
                    assert await r.read() == b"data: 0\n\ndata: 1\n\ndata: 2\n\ndata: [DONE]\n\n"
    run(body())


def test_malformed_and_oversized_requests_get_an_openai_shaped_4xx_and_a_closed_connection():
    async def body():
        limits = Limits(max_body_bytes=1000, max_head_bytes=2000, max_headers=20)
        async with server(limits) as (app, port):
            cases = [(b"NOT-HTTP\r\n\r\n", 400),
                     (b"GET http://elsewhere/x HTTP/1.1\r\nHost: x\r\n\r\n", 400),  # absolute form: not a proxy
                     (b"POST /x HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", 400),
                     (b"POST /x HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
                     (b"GET /x HTTP/1.1\r\nBad Header: 1\r\n\r\n", 400),
                     (post("/x", b"{}", b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"), 400),
                     (post("/x", b"y" * 1001), 413),
                     (b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3e9\r\n" + b"y" * 1001, 413),
                     (b"GET /x HTTP/1.1\r\nX-Big: " + b"y" * 3000 + b"\r\n\r\n", 431),
                     (b"GET /x HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(30)) + b"\r\n", 431)]
            for raw, expected in cases:
                reader, writer = await connect(port)
                writer.write(raw)
                status, headers, body = await read_answer(reader)
                assert status == expected, raw[:60]
                assert set(json.loads(body)["error"]) == {"message", "type", "param", "code"}
                assert headers["connection"] == "close"
                assert await asyncio.wait_for(reader.read(), 5) == b""
                writer.close()
            assert app.seen == []  # none reached the handler
            reader, writer = await connect(port)  # an upgrade without a body is served, then the connection closes
            writer.write(b"GET /u HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n")
            status, headers, raw = await read_answer(reader)
            assert status == 200 and json.loads(raw)["path"] == "/u" and headers["connection"] == "close"
            assert await asyncio.wait_for(reader.read(), 5) == b""
    run(body())


def test_a_client_that_leaves_cancels_its_handler():
    async def body():
        async with server() as (app, port):
            reader, writer = await connect(port)
            writer.write(post("/hang", b""))
            while not app.seen:
                await asyncio.sleep(0.01)
            writer.close()
            await asyncio.wait_for(app.cancelled.wait(), 5)
    run(body())


def test_a_failing_or_silent_handler_gets_a_500_and_the_connection_serves_on():
    async def body():
        async with server() as (app, port):
            reader, writer = await connect(port)
            for path in ("/boom", "/silent"):
                writer.write(post(path, b""))
                status, _, raw = await read_answer(reader)
                assert status == 500 and json.loads(raw)["error"]["type"] == "internal_error"
            writer.write(post("/ok", b""))
            assert (await read_answer(reader))[0] == 200
            writer.close()
    run(body())


def test_idle_connections_are_closed_after_the_idle_limit():
    async def body():
        async with server(Limits(idle_s=0.3)) as (app, port):
            reader, writer = await connect(port)
            writer.write(post("/a", b""))
            assert (await read_answer(reader))[0] == 200
            assert await asyncio.wait_for(reader.read(), 3) == b""  # closed within a few idle periods
            reader, writer = await connect(port)
            writer.write(b"GET /a HTTP/1.1\r\nHost:")  # a head that never ends is not kept forever either
            assert await asyncio.wait_for(reader.read(), 3) == b""
    run(body())


def test_stop_gives_requests_in_progress_a_grace_period_then_answers_503():
    async def body():
        app = App()
        srv = await HTTPServer.start("127.0.0.1", 0, app, Limits())
        reader, writer = await connect(srv.port)
        writer.write(post("/hang", b""))
        while not app.seen:
            await asyncio.sleep(0.01)
        t = asyncio.get_running_loop().time()
        await srv.stop(0.3)
        assert app.cancelled.is_set() and asyncio.get_running_loop().time() - t < 2
        status, headers, raw = await read_answer(reader)
        assert status == 503 and headers["connection"] == "close"
        assert json.loads(raw)["error"]["type"] == "service_unavailable"
        assert await asyncio.wait_for(reader.read(), 3) == b""
    run(body())


class _CountingTransport:
    """The socket's transport with its writes counted (what reaches the kernel: one system call each)."""

    def __init__(self, transport, writes: list[bytes]):
        self.transport, self.writes = transport, writes

    def write(self, data: bytes) -> None:
        self.writes.append(data)
        self.transport.write(data)

    def close(self) -> None:
        self.transport.close()

    def is_closing(self) -> bool:
        return self.transport.is_closing()


def test_a_whole_answer_written_at_once_is_the_bytes_uvicorns_send_writes(monkeypatch):
    """Request.respond writes a whole answer itself (HeadWithBody.respond_now) rather than through uvicorn's
    send: the bytes on the wire are send's, on a kept connection, one the client closes, an HTTP/1.0 one, and
    on a draining server's (Connection: close)."""
    from hybrid_pd.proxy.http import server as server_module

    requests = (post("/a", b"x"), post("/b", b"", b"Connection: close\r\n"), b"POST /c HTTP/1.0\r\n\r\n")

    async def answers() -> list[bytes]:
        app = App()
        srv = await HTTPServer.start("127.0.0.1", 0, app, DEFAULT_LIMITS)
        out = []
        try:
            for draining in (False, True):
                srv.draining = draining
                for request in requests:
                    reader, writer = await connect(srv.port)
                    writer.write(request)
                    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
                    length = int(head.split(b"content-length: ")[1].split(b"\r\n")[0])
                    raw = head + await asyncio.wait_for(reader.readexactly(length), 5)
                    out.append(b"\r\n".join(x for x in raw.split(b"\r\n") if not x.startswith(b"date: ")))
                    writer.close()
        finally:
            await srv.stop()
        return out

    written_at_once = run(answers())
    monkeypatch.setattr(server_module.HeadWithBody, "respond_now", lambda self, *a: False)
    through_send = run(answers())
    assert written_at_once == through_send
    assert [b"connection: close" in raw for raw in written_at_once] == [False, True, True, True, True, True]


def test_a_request_leaves_no_reference_cycle_for_the_collector():
    """A served request's cycle, transport wrapper and Request are freed when the last reference goes, not by
    the cyclic collector (a cycle per request costs a collection every few dozen requests). Counted while the
    connection is open (a closed connection's protocol is the collector's, once per connection)."""
    import gc

    kept: set[str] = set()

    async def body():
        async with server() as (app, port):
            reader, writer = await connect(port)
            gc.collect()
            gc.set_debug(gc.DEBUG_SAVEALL)
            try:
                for path in ("/a", "/stream", "/a", "/boom", "/silent", "/a"):
                    writer.write(post(path, b"x"))
                    await read_answer(reader)
                await asyncio.sleep(0.05)
                app.seen.clear()
                gc.collect()
                names = {type(o).__name__ for o in gc.garbage}
                kept.update(names & {"RequestResponseCycle", "HeadWithBody", "Request"})
            finally:
                gc.set_debug(0)
                gc.garbage.clear()
            writer.close()

    run(body())
    assert not kept, f"reference cycles through {sorted(kept)}"


def test_an_answer_leaves_in_one_write_with_its_head(monkeypatch):
    """uvicorn writes a head alone and then the body: the server holds the head for the body's first bytes. A
    whole answer is one write; a stream's head leaves with its first part; a HEAD answer (no body bytes) and a
    100 Continue still leave at once."""
    from hybrid_pd.proxy.http import server as server_module

    writes: list[bytes] = []
    real = server_module.HeadWithBody.__init__
    monkeypatch.setattr(server_module.HeadWithBody, "__init__",
                        lambda self, t, flow, cycle: real(self, _CountingTransport(t, writes), flow, cycle))

    async def body():
        async with server() as (app, port):
            reader, writer = await connect(port)
            writer.write(post("/one", b"x"))
            status, headers, raw = await read_answer(reader)
            assert status == 200 and json.loads(raw)["path"] == "/one"
            assert len(writes) == 1 and writes[0].startswith(b"HTTP/1.1 200") and writes[0].endswith(raw)
            writes.clear()
            writer.write(post("/stream", b""))
            status, _, raw = await read_answer(reader)
            assert raw == b"data: 0\n\ndata: 1\n\ndata: 2\n\ndata: [DONE]\n\n"
            assert len(writes) == 4 and writes[0].startswith(b"HTTP/1.1 200") and writes[0].endswith(b"data: 0\n\n\r\n")
            writes.clear()
            writer.write(b"HEAD /h HTTP/1.1\r\nHost: x\r\n\r\n")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 200") and len(writes) == 1
            writer.close()
    run(body())
