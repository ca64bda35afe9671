"""Hypothesis: a body that is not a valid request gets a 4xx in OpenAI's shape, a valid one a 200 with the
fake decoder's answer (whether it is valid is judged here, by `expected_valid`, from what the proxy's API
promises), and the proxy keeps serving.

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


def check(status: int, raw: bytes, valid: bool) -> None:
    """A valid request gets a 200 with the fake decoder's answer, any other body a 4xx in OpenAI's shape."""
    if valid:
        assert status == 200, raw[:300]
    else:
        assert 400 <= status < 500, (status, raw[:300])
    if status >= 400:
        err = json.loads(raw)["error"]
        assert set(err) == {"message", "type", "param", "code"}
    elif raw.startswith(b"data: "):  # a stream: the fake decoder's chunks, then [DONE]
        assert raw.rstrip().endswith(b"data: [DONE]") and b'"error"' not in raw, raw[:300]
    else:
        assert json.loads(raw)["choices"][0], raw[:300]


WIRE_INTS = (-(2**63), 2**64 - 1)  # what vLLM's engine-core wire format (msgpack) carries


def expected_valid(path: str, raw: bytes, content_type: str = "application/json") -> bool:
    """Whether the proxy must serve this request (else refuse it with a 4xx): JSON sent as such, an object whose
    fields the proxy reads have their types, a prompt or messages, and none of the values vLLM answers with a
    500 (benchmarks/results/2026-11-25-cpu-vllm-500-fields)."""
    if content_type.split(";", 1)[0].strip().lower() != "application/json":
        return False
    try:
        body = json.loads(raw, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        return False
    if not isinstance(body, dict) or _depth(body) > MAX_NESTING:
        return False
    chat = path.endswith("chat/completions")
    kinds = {"model": str, "stream": bool, "stream_options": dict, "user": str, "n": int, "max_tokens": int,
             "max_completion_tokens": int, "min_tokens": int, "structured_outputs": dict, "stream_interval": int}
    if not all(body.get(k) is None or _is(body[k], t) for k, t in kinds.items()):
        return False
    rep = body.get("repetition_detection")
    rep_sizes = [rep.get(k) for k in ("max_pattern_size", "min_pattern_size", "min_count")] if isinstance(rep, dict) \
        else []
    if not all(v is None or (_is(v, int) and _fits(v)) for v in rep_sizes):
        return False
    if not _fits(body.get("structured_outputs")) or not _fits(body.get("stream_interval")):
        return False
    if body.get("stream_options") is not None and not body.get("stream"):
        return False
    n, min_tokens = body.get("n"), body.get("min_tokens")
    cap = body.get("max_completion_tokens") if chat and body.get("max_completion_tokens") is not None \
        else body.get("max_tokens")
    if (n is not None and n < 1) or (min_tokens is not None and (min_tokens < 0 or (cap is not None and
                                                                                       min_tokens > cap))):
        return False
    if chat:
        msgs = body.get("messages")
        return isinstance(msgs, list) and bool(msgs) and all(isinstance(m, dict) for m in msgs)
    prompt = body.get("prompt")
    token_ids = lambda x: isinstance(x, list) and bool(x) and all(_is(t, int) for t in x)  # noqa: E731
    return isinstance(prompt, str) or token_ids(prompt) or (
        isinstance(prompt, list) and bool(prompt) and (all(isinstance(p, str) for p in prompt)
                                                       or all(token_ids(p) for p in prompt)))


def _is(value, kind: type) -> bool:
    return isinstance(value, kind) and not (kind is int and isinstance(value, bool))


def _fits(value) -> bool:
    if _is(value, int):
        return WIRE_INTS[0] <= value <= WIRE_INTS[1]
    if isinstance(value, dict):
        return all(_fits(v) for v in value.values())
    if isinstance(value, list):
        return all(_fits(v) for v in value)
    return True


def _depth(value) -> int:
    """Levels of arrays and objects (iterative: the bodies nest deeper than Python's recursion limit)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        node, depth = todo.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is not None:
            deepest = max(deepest, depth)
            todo.extend((c, depth + 1) for c in children)
    return deepest


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


huge_ints = st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 10**30])
json_values = st.recursive(st.none() | st.booleans() | st.integers() | huge_ints | st.floats(allow_nan=False)
                           | st.text(),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                        max_size=4), max_leaves=12)
request_like = st.fixed_dictionaries({}, optional={
    "model": json_values, "prompt": json_values, "messages": json_values, "stream": json_values,
    "stream_options": json_values, "max_tokens": json_values, "n": json_values, "user": json_values,
    "kv_transfer_params": json_values, "min_tokens": json_values, "max_completion_tokens": json_values,
    "structured_outputs": json_values, "stream_interval": json_values,
    "repetition_detection": st.dictionaries(st.sampled_from(["max_pattern_size", "min_pattern_size", "min_count"]),
                                            json_values, max_size=3) | json_values})
# valid shapes often enough that Hypothesis tries values next to them, not only garbage
plausible = st.fixed_dictionaries({"prompt": st.text(min_size=1, max_size=20) | st.lists(
    st.integers(0, 50_000), min_size=1, max_size=5), "messages": st.lists(st.fixed_dictionaries(
        {"role": st.just("user"), "content": st.text(max_size=10)}), min_size=1, max_size=2)})
FIELDS = ("model", "stream", "stream_options", "max_tokens", "max_completion_tokens", "min_tokens", "n", "user",
          "structured_outputs", "stream_interval", "repetition_detection", "kv_transfer_params")
field_values = st.integers(-2, 4) | json_values | st.fixed_dictionaries(
    {}, optional={k: json_values for k in ("max_pattern_size", "min_pattern_size", "min_count", "json")})
request_like = st.tuples(plausible, request_like).map(lambda t: {**t[0], **t[1]}) | request_like
header_text = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40)
PATHS = st.sampled_from(["/v1/completions", "/v1/chat/completions"])
FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))


@FUZZ
@given(path=PATHS, body=st.binary(max_size=200))
def test_random_bytes(proxy_addr, path, body):
    check(*send(proxy_addr, "POST", path, body, {"Content-Type": "application/json"}), expected_valid(path, body))


@FUZZ
@given(path=PATHS, body=json_values)
def test_random_json(proxy_addr, path, body):
    raw = json.dumps(body).encode()
    check(*send(proxy_addr, "POST", path, raw, {"Content-Type": "application/json"}), expected_valid(path, raw))


@FUZZ
@given(path=PATHS, body=request_like, session=header_text, rid=header_text,
       ctype=st.sampled_from(["application/json", "Application/JSON; charset=utf-8"]) | header_text)
def test_request_like_bodies_and_headers(proxy_addr, path, body, session, ctype, rid):
    raw = json.dumps(body).encode()
    status, answer = send(proxy_addr, "POST", path, raw,
                          {"Content-Type": ctype, "x-session-id": session, "X-Request-Id": rid})
    check(status, answer, expected_valid(path, raw, ctype))


@pytest.mark.parametrize("field", FIELDS)
@settings(FUZZ, max_examples=60)
@given(path=PATHS, base=plausible, value=field_values)
def test_one_field_at_a_time(proxy_addr, field, path, base, value):
    """A valid prompt and one field: whether that field's value is refused or served shows in the status."""
    raw = json.dumps({**base, field: value}).encode()
    status, answer = send(proxy_addr, "POST", path, raw, {"Content-Type": "application/json"})
    check(status, answer, expected_valid(path, raw))


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
    check(status, raw, valid=False)
    assert status == 400, raw


def nested(depth: int, opener: bytes) -> bytes:
    closer = b"]" if opener == b"[" else b"}"
    return b'{"model": "tiny", "prompt": "x", "extra": ' + opener * depth + b"1" + closer * depth + b"}"


@FUZZ
@given(path=PATHS, depth=st.integers(200, 5000), opener=st.sampled_from([b"[", b'{"a":']))
def test_deep_nesting_is_never_a_5xx(proxy_addr, path, depth, opener):
    """msgspec decodes deeper than it can encode again from a request's stack (a flaky 500 once): past
    MAX_NESTING levels a body is refused, below it served."""
    body = nested(depth, opener)
    status, raw = send(proxy_addr, "POST", path, body, {"Content-Type": "application/json"})
    check(status, raw, expected_valid(path, body))
    if depth + 1 > MAX_NESTING:
        assert status == 400 and b"nested too deeply" in raw, (depth, status, raw[:200])


@pytest.mark.parametrize("opener", [b"[", b'{"a":'])
def test_too_deep_nesting_is_a_400(proxy_addr, opener):
    status, raw = send(proxy_addr, "POST", "/v1/completions", nested(100_000, opener),
                       {"Content-Type": "application/json"})
    check(status, raw, valid=False)
    assert status == 400 and b"nested too deeply" in raw


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x", "application/jsonx"])
def test_a_body_that_does_not_say_it_is_json_is_refused_as_vllm_does(proxy_addr, content_type):
    headers = {"Content-Type": content_type} if content_type else {}
    status, raw = send(proxy_addr, "POST", "/v1/completions", b'{"prompt": "ok"}', headers)
    check(status, raw, valid=False)
    assert status == 400 and b"Only 'application/json' is allowed" in raw


def test_json_content_type_with_parameters_is_served(proxy_addr):
    status, raw = send(proxy_addr, "POST", "/v1/completions", b'{"prompt": "ok"}',
                       {"Content-Type": "Application/JSON; charset=utf-8"})
    assert status == 200, raw


def test_still_serving_after_the_fuzz(proxy_addr):
    status, raw = send(proxy_addr, "POST", "/v1/completions", b'{"prompt": "ok"}',
                       {"Content-Type": "application/json"})
    assert status == 200 and json.loads(raw)["choices"][0]["text"] == "Hello"
