"""The SSE relay under a client that reads slowly or not at all: the proxy holds the decoder back instead of
buffering its stream, loses nothing once the client reads, and never waits past the total timeout."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from tests.proxy.fakes import cluster, run

EVENTS = 48
REQ = {"model": "m", "prompt": "hello world", "max_tokens": EVENTS, "stream": True}


def big_chunks() -> tuple[str, ...]:
    """48 events of 1 MiB each: more than every socket buffer between the decoder and the client can hold."""
    return tuple(f"{i:04d}" + "x" * (1 << 20) for i in range(EVENTS))


def test_a_client_that_does_not_read_holds_the_decoder_back_and_loses_nothing():
    async def body():
        async with cluster() as c:
            c.d.chunks = big_chunks()
            async with aiohttp.ClientSession() as s, s.post(c.url + "/v1/completions", json=REQ) as r:
                assert r.status == 200
                # A negative claim needs a window: the client reads nothing for a second. A relay that
                # buffered the stream would let the decoder finish at once.
                await asyncio.sleep(1.0)
                assert not c.d.finished.is_set()
                text = (await r.read()).decode()
            events = [ln[6:] for ln in text.split("\n") if ln.startswith("data: ")]
            assert events[-1] == "[DONE]"
            texts = [json.loads(e)["choices"][0]["text"] for e in events[:-1]]
            assert texts == list(big_chunks())
            await asyncio.wait_for(c.d.finished.wait(), 5)
            assert not c.d.client_gone.is_set()
    run(body(), 60)


def test_a_client_that_never_reads_is_cut_at_the_total_timeout():
    async def body():
        async with cluster(total_timeout=1.5) as c:
            c.d.chunks = big_chunks()
            reader, writer = await asyncio.open_connection("127.0.0.1", int(c.url.rsplit(":", 1)[1]))
            payload = json.dumps(REQ).encode()
            writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload))
            await writer.drain()
            # The client never reads: at the deadline the proxy aborts the decode leg and closes the client.
            await asyncio.wait_for(c.d.client_gone.wait(), 10)
            got = 0
            while chunk := await asyncio.wait_for(reader.read(1 << 20), 10):
                got += len(chunk)
            assert got < EVENTS << 20  # cut short, not completed
            writer.close()
            deadline = asyncio.get_running_loop().time() + 5
            while c.state.admission.active or c.state.pool.all("decode")[0].in_flight:
                assert asyncio.get_running_loop().time() < deadline, "the request's slot was not given back"
                await asyncio.sleep(0.01)
    run(body(), 60)


def test_an_http10_client_gets_the_stream_unchunked_until_close():
    async def body():
        async with cluster() as c:
            reader, writer = await asyncio.open_connection("127.0.0.1", int(c.url.rsplit(":", 1)[1]))
            payload = json.dumps(dict(REQ, max_tokens=2)).encode()
            writer.write(b"POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload))
            raw = await asyncio.wait_for(reader.read(), 10)  # to the end: the proxy closes after the answer
            writer.close()
            head, _, text = raw.partition(b"\r\n\r\n")
            assert b" 200 " in head.split(b"\r\n")[0] and b"chunked" not in head.lower()
            events = [ln[6:] for ln in text.decode().split("\n") if ln.startswith("data: ")]
            assert [json.loads(e)["choices"][0]["text"] for e in events[:-1]] == ["Hel", "lo"]
            assert events[-1] == "[DONE]"
    run(body())
