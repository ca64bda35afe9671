"""The lean HTTP/1.1 client (proxy/http/client.py) against a raw TCP server that answers byte for byte as told:
chunked bodies split anywhere, chunk extensions and trailers, content-length, until-close, keep-alive reuse,
a reused connection the server closed, a broken stream, a head that never comes, repeated headers, ambiguous
framing, the body cap, and (Hypothesis) answers split anywhere or mangled."""

from __future__ import annotations

import asyncio

import pytest

from hybrid_pd.proxy.errors import BrokenAnswer, ConnectFailed, Disconnected
from hybrid_pd.proxy.http.client import HTTPPool
from tests.proxy.fakes import run

CHUNKED = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\nTransfer-Encoding: chunked\r\n\r\n"
           b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-Trailer: 1\r\n\r\n")


async def serve(answers: list[bytes], *, split: int = 0, close_after: bool = False):
    """A server that answers each request on a connection with the next of `answers` (split in pieces of
    `split` bytes when > 0); returns (base URL, server, connections accepted)."""
    accepted = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)
        while answers:
            head = await reader.readuntil(b"\r\n\r\n")
            length = [int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")]
            await reader.readexactly(length[0] if length else 0)
            data = answers.pop(0)
            for i in range(0, len(data), split or len(data)):
                writer.write(data[i:i + (split or len(data))])
                await writer.drain()
                await asyncio.sleep(0.001)
            if close_after:
                break
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", server, accepted


@pytest.mark.parametrize("split", [0, 1, 3, 7])
def test_chunked_body_split_anywhere_and_connection_reused(split):
    async def body():
        base, server, accepted = await serve([CHUNKED, CHUNKED], split=split)
        pool = HTTPPool(connect_timeout=2)
        for _ in range(2):
            resp = await pool.request("POST", base, "/x", b"{}", {"Content-Type": "application/json"}, timeout=5)
            assert (resp.status, resp.content_type) == (200, "text/event-stream")
            got = b""
            while chunk := await resp.readany(5):
                got += chunk
            assert got == b"hello world"
            resp.close()
        assert len(accepted) == 1  # keep-alive: both answers on one connection
        pool.close()
        server.close()
    run(body())


def test_content_length_and_until_close():
    async def body():
        body = b'{"a": 1}'
        base, server, _ = await serve([b"HTTP/1.1 201 Created\r\nContent-Length: 8\r\n\r\n" + body,
                                       b"HTTP/1.0 200 OK\r\n\r\nuntil close"], split=4)
        pool = HTTPPool(connect_timeout=2)
        resp = await pool.request("GET", base, "/", None, None, timeout=5)
        assert (resp.status, await resp.read(5)) == (201, body)
        resp = await pool.request("GET", base, "/", None, None, timeout=5)
        assert await resp.read(5) == b"until close"
        pool.close()
        server.close()
    run(body())


def test_reused_connection_closed_by_the_server_is_retried_once():
    async def body():
        base, server, accepted = await serve([b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"] * 2, close_after=True)
        pool = HTTPPool(connect_timeout=2)
        assert (await pool.request("GET", base, "/", None, None, timeout=5)).status == 200
        await asyncio.sleep(0.05)  # the server closed the idle connection
        assert (await pool.request("GET", base, "/", None, None, timeout=5)).status == 200
        assert len(accepted) == 2
        pool.close()
        server.close()
    run(body())


def test_broken_stream_head_timeout_and_refused_connection():
    async def body():
        head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel"
        base, server, _ = await serve([head], close_after=True)
        pool = HTTPPool(connect_timeout=2)
        resp = await pool.request("POST", base, "/", b"", None, timeout=5)
        assert await resp.readany(5) == b"hel"
        with pytest.raises(BrokenAnswer):
            await resp.readany(5)
        server.close()
        silent = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        with pytest.raises(TimeoutError):
            await pool.request("GET", f"http://127.0.0.1:{silent.sockets[0].getsockname()[1]}", "/", None, None,
                               timeout=0.2)
        silent.close()
        with pytest.raises(ConnectFailed):
            await pool.request("GET", "http://127.0.0.1:9", "/", None, None, timeout=2)
        pool.close()
    run(body())


def test_repeated_headers_are_joined_and_ambiguous_framing_is_refused():
    async def body():
        bad = [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nabc",  # which length?
               b"HTTP/1.1 200 OK\r\nContent-Length: 2\rX-Evil: 1\r\n\r\nab",  # a bare CR inside the head
               b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n"]  # not a chunk size
        good = b"HTTP/1.1 200 OK\r\nX-A: 1\r\nx-a: 2\r\nContent-Length: 2\r\n\r\nok"
        base, server, _ = await serve([good, *bad])
        pool = HTTPPool(connect_timeout=2)
        resp = await pool.request("GET", base, "/", None, None, timeout=5)
        assert resp.headers["x-a"] == "1, 2" and await resp.read(5) == b"ok"
        for _ in bad:
            with pytest.raises(BrokenAnswer):
                resp = await pool.request("GET", base, "/", None, None, timeout=5)
                await resp.read(5)
            server.close()
            base, server, _ = await serve(list(bad[bad.index(_) + 1:]))
        pool.close()
        server.close()
    run(body())


def test_an_answer_over_the_body_cap_is_refused(monkeypatch):
    from hybrid_pd.proxy.http import client
    monkeypatch.setattr(client, "MAX_BODY", 10)

    async def body():
        base, server, _ = await serve([b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n" + b"x" * 11])
        pool = HTTPPool(connect_timeout=2)
        resp = await pool.request("GET", base, "/", None, None, timeout=5)
        with pytest.raises(BrokenAnswer):
            await resp.read(5)
        pool.close()
        server.close()
    run(body())


# ---- Hypothesis: answers split anywhere, and mangled heads ---------------------------------------------------
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

ANSWERS = [CHUNKED, b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nhello world"]


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(which=st.sampled_from(ANSWERS), cuts=st.lists(st.integers(1, 200), max_size=6),
       edits=st.lists(st.tuples(st.integers(0, 200), st.binary(max_size=6)), max_size=3))
def test_answers_split_anywhere_read_the_same_and_mangled_ones_fail_cleanly(which, cuts, edits):
    """Split at any points, an answer reads as itself; mangled, it reads as itself, or as what its framing
    says, or fails with BrokenAnswer, Disconnected (closed before a head) or TimeoutError (a head that never
    ends): never another error, never a hang."""
    async def body():
        data = which
        for pos, repl in edits:
            pos %= len(data) + 1
            data = data[:pos] + repl + data[pos + len(repl):]
        pieces, last = [], 0
        for cut in sorted(set(cuts)):
            if cut < len(data):
                pieces.append(data[last:cut])
                last = cut
        pieces.append(data[last:])

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            for piece in pieces:
                writer.write(piece)
                await writer.drain()
                await asyncio.sleep(0.001)
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        pool = HTTPPool(connect_timeout=2)
        try:
            resp = await pool.request("GET", f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", "/", None,
                                      None, timeout=2)
            got = await resp.read(2)
            if not edits:
                assert (resp.status, got) == (200, b"hello world")
        except (BrokenAnswer, Disconnected, TimeoutError):
            assert edits, "an intact answer failed"
        finally:
            pool.close()
            server.close()
    run(body())
