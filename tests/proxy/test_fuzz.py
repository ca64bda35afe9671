"""Hypothesis: malformed bodies and headers get a 4xx (never a 5xx), and the proxy keeps serving.

The proxy and its fake workers run in a background thread's event loop for the whole module; examples are
sent with a blocking client, so Hypothesis drives plain synchronous code."""

from __future__ import annotations

import asyncio
import http.client
import json
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.proxy.fakes import cluster


@pytest.fixture(scope="module")
def proxy_addr():
    ready, stop = threading.Event(), None
    box: dict = {}

    async def main():
        nonlocal stop
        stop = asyncio.Event()
        async with cluster() as c:
            box["c"] = c
            ready.set()
            await stop.wait()

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    assert ready.wait(15), "proxy did not start"
    host, port = box["c"].url.removeprefix("http://").split(":")
    yield host, int(port)
    loop.call_soon_threadsafe(stop.set)
    thread.join(10)


def send(addr, method: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(*addr, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def check(status: int, raw: bytes) -> None:
    assert status < 500, raw[:300]
    if status >= 400:
        err = json.loads(raw)["error"]
        assert set(err) == {"message", "type", "param", "code"}


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                        max_size=4), max_leaves=12)
request_like = st.fixed_dictionaries({}, optional={
    "model": json_values, "prompt": json_values, "messages": json_values, "stream": json_values,
    "stream_options": json_values, "max_tokens": json_values, "n": json_values, "user": json_values,
    "kv_transfer_params": json_values, "min_tokens": json_values})
header_text = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40)
PATHS = st.sampled_from(["/v1/completions", "/v1/chat/completions"])
FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))


@FUZZ
@given(path=PATHS, body=st.binary(max_size=200))
def test_random_bytes(proxy_addr, path, body):
    check(*send(proxy_addr, "POST", path, body, {"Content-Type": "application/json"}))


@FUZZ
@given(path=PATHS, body=json_values)
def test_random_json(proxy_addr, path, body):
    check(*send(proxy_addr, "POST", path, json.dumps(body).encode(), {"Content-Type": "application/json"}))


@FUZZ
@given(path=PATHS, body=request_like, session=header_text, ctype=header_text, rid=header_text)
def test_request_like_bodies_and_headers(proxy_addr, path, body, session, ctype, rid):
    status, raw = send(proxy_addr, "POST", path, json.dumps(body).encode(),
                       {"Content-Type": ctype, "x-session-id": session, "X-Request-Id": rid})
    check(status, raw)


def test_still_serving_after_the_fuzz(proxy_addr):
    status, raw = send(proxy_addr, "POST", "/v1/completions", b'{"prompt": "ok"}', {})
    assert status == 200 and json.loads(raw)["choices"][0]["text"] == "Hello"
