"""The lean HTTP/1.1 client (proxy/http/client.py) against a raw TCP server that answers byte for byte as told:
chunked bodies split anywhere, chunk extensions and trailers, content-length, until-close, keep-alive reuse,
a reused connection the server closed, a broken stream, a head that never comes."""

from __future__ import annotations

import asyncio

import pytest

from hybrid_pd.proxy.errors import BrokenAnswer, ConnectFailed
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
