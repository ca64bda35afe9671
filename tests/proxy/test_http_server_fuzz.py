"""The proxy's HTTP server under arbitrary bytes where a request head should be (Hypothesis): an answer or a 4xx in
OpenAI's error shape, never a hang, and the server serves on."""

from __future__ import annotations

import asyncio
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybrid_pd.proxy.http.server import Limits
from tests.proxy.fakes import run
from tests.proxy.test_http_server import connect, read_answer, server

VALID = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


def mutate(data: bytes, edits: list[tuple[int, bytes]]) -> bytes:
    for pos, repl in edits:
        pos %= len(data) + 1
        data = data[:pos] + repl + data[pos + len(repl) // 2:]
    return data


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(edits=st.lists(st.tuples(st.integers(0, len(VALID)), st.binary(max_size=12)), max_size=4),
       tail=st.binary(max_size=64))
def test_mangled_requests_get_an_answer_or_a_4xx_never_a_hang_and_the_server_serves_on(edits, tail):
    async def body():
        async with server(Limits(max_body_bytes=4096, max_head_bytes=4096)) as (app, port):
            reader, writer = await connect(port)
            writer.write(mutate(VALID, edits) + tail)
            writer.write_eof()  # nothing more comes: the server must answer what it has, or close
            data = await asyncio.wait_for(reader.read(), 5)  # never a hang
            for head in data.split(b"HTTP/1.1 ")[1:]:
                status = int(head[:3])
                assert status == 200 or 400 <= status < 500, data[:200]
                if status >= 400:
                    assert b'"invalid_request_error"' in head
            writer.close()
            reader, writer = await connect(port)  # still serving
            writer.write(VALID)
            status, _, raw = await read_answer(reader)
            assert status == 200 and json.loads(raw)["body"] == "{}"
            writer.close()
    run(body())
