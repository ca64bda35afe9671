"""The bodies that make vLLM answer 500 (the fuzzer's findings, benchmarks/vllm_500_fields.py), against a real
engine (the tiny model, decode launcher, no connector): sent to the engine directly they still get a 500 on this
vLLM; sent through the proxy they get a 400 in OpenAI's shape, and the engine keeps serving."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

import pytest

from hybrid_pd.proxy.app import serve_in_background
from hybrid_pd.proxy.config import ProxyConfig
from tests.proxy.fakes import run
from tests.proxy.test_request_fields import FINDINGS, PATHS

pytestmark = pytest.mark.engines

# Beyond the fuzzer's one-field-at-a-time bodies: a size msgpack cannot carry that passes vLLM's own check
# because another field of the same object makes it valid.
COMBINED = {"endpoint": "completions", "field": "repetition_detection.max_pattern_size",
            "body": {"model": "tiny", "prompt": "the quick brown fox", "max_tokens": 1,
                     "repetition_detection": {"max_pattern_size": 2**64, "min_count": 2}}}
BODIES = [*FINDINGS, COMBINED]


@pytest.fixture(scope="module")
def engine_url(engine_set, tiny_model):
    return engine_set({"engine": ("decode", "none", "1", tiny_model)}).up("engine")["engine"]


def post(url: str, body: dict) -> tuple[int, dict]:
    """(status, answer); a 200 stream that ends in an SSE error event counts as that event's code."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            raw = r.read()
            if r.headers.get_content_type() != "text/event-stream":
                return r.status, json.loads(raw)
            events = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith(b"data: {")]
            cut = [e for e in events if "error" in e]
            return (cut[0]["error"]["code"], cut[0]) if cut else (r.status, {"events": events})
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_the_bodies_still_give_this_vllm_a_500(engine_url):
    """If this fails, vLLM now refuses a body itself: its rule in proxy/request_fields.py can go."""
    got = {(f["endpoint"], json.dumps(f["body"])): post(engine_url + PATHS[f["endpoint"]], f["body"])[0]
           for f in BODIES}
    assert set(got.values()) == {500}, {k: v for k, v in got.items() if v != 500}


def test_through_the_proxy_every_body_gets_a_400_and_the_engine_keeps_serving(engine_url):
    async def body():
        config = ProxyConfig.from_flat({"port": 0, "decode": [engine_url], "health_interval": 0})
        async with serve_in_background(config) as proxy:  # this loop serves it: the client posts from a thread
            answers = [await asyncio.to_thread(post, proxy.url + PATHS[f["endpoint"]], f["body"]) for f in BODIES]
            good = await asyncio.to_thread(post, proxy.url + "/v1/completions",
                                           {"model": "tiny", "prompt": "the quick brown fox", "max_tokens": 2})
            return answers, good

    answers, good = run(body(), timeout=300)
    for finding, (status, answer) in zip(BODIES, answers):
        assert status == 400, (finding["field"], finding["body"], answer)
        assert set(answer["error"]) == {"message", "type", "param", "code"}, answer
        assert finding["field"].startswith(answer["error"]["param"]), (finding["field"], answer)
    assert good[0] == 200 and good[1]["choices"][0]["text"], good
