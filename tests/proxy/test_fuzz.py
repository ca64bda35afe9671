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

from hybrid_pd.proxy.openai_api import MAX_NESTING
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


def invalid_utf8_strings():
    """JSON whose string holds bytes that are not UTF-8 (vLLM: 400)."""
    bad = st.binary(min_size=1, max_size=4).filter(lambda b: not _is_utf8(b))
    return st.tuples(st.text(max_size=10), bad).map(
        lambda t: b'{"model": "tiny", "prompt": "' + t[0].encode().replace(b'"', b"") + t[1].replace(b'"', b"")
        + b'", "max_tokens": 2}')


def _is_utf8(b: bytes) -> bool:
    try:
        b.decode()
        return True
    except UnicodeDecodeError:
        return False


@FUZZ
@given(path=PATHS, body=invalid_utf8_strings())
def test_invalid_utf8_inside_a_string_is_a_400(proxy_addr, path, body):
    status, raw = send(proxy_addr, "POST", path, body, {"Content-Type": "application/json"})
    check(status, raw)
    assert status == 400, raw


def nested(depth: int, opener: bytes) -> bytes:
    closer = b"]" if opener == b"[" else b"}"
    return b'{"model": "tiny", "prompt": "x", "extra": ' + opener * depth + b"1" + closer * depth + b"}"


@FUZZ
@given(path=PATHS, depth=st.integers(200, 5000), opener=st.sampled_from([b"[", b'{"a":']))
def test_deep_nesting_is_never_a_5xx(proxy_addr, path, depth, opener):
    """msgspec decodes deeper than it can encode again from a request's stack (a flaky 500 once): past
    MAX_NESTING levels a body is refused, below it served."""
    status, raw = send(proxy_addr, "POST", path, nested(depth, opener), {"Content-Type": "application/json"})
    check(status, raw)
    if depth + 1 > MAX_NESTING:
        assert status == 400 and b"nested too deeply" in raw, (depth, status, raw[:200])


@pytest.mark.parametrize("opener", [b"[", b'{"a":'])
def test_too_deep_nesting_is_a_400(proxy_addr, opener):
    status, raw = send(proxy_addr, "POST", "/v1/completions", nested(100_000, opener),
                       {"Content-Type": "application/json"})
    check(status, raw)
    assert status == 400 and b"nested too deeply" in raw


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x", "application/jsonx"])
def test_a_body_that_does_not_say_it_is_json_is_refused_as_vllm_does(proxy_addr, content_type):
    headers = {"Content-Type": content_type} if content_type else {}
    status, raw = send(proxy_addr, "POST", "/v1/completions", b'{"prompt": "ok"}', headers)
    check(status, raw)
    assert status == 400 and b"Only 'application/json' is allowed" in raw


def test_json_content_type_with_parameters_is_served(proxy_addr):
    status, raw = send(proxy_addr, "POST", "/v1/completions", b'{"prompt": "ok"}',
                       {"Content-Type": "Application/JSON; charset=utf-8"})
    assert status == 200, raw


def test_still_serving_after_the_fuzz(proxy_addr):
    status, raw = send(proxy_addr, "POST", "/v1/completions", b'{"prompt": "ok"}',
                       {"Content-Type": "application/json"})
    assert status == 200 and json.loads(raw)["choices"][0]["text"] == "Hello"
