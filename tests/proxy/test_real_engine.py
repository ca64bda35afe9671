"""The KV-event index against a real vLLM engine (the tiny hybrid model, align mode, vLLM's own KV events):
the proxy's hashes of the tokenized prompt, applied to the engine's events, predict exactly the prefix hit the
engine then reports for the same prompt.

Opt-in (one engine costs ~40 s and 2-3 GB): runs with `-m engines` or HYBRID_PD_PROXY_ENGINES=1, so the
default proxy suite stays fast.
"""

from __future__ import annotations

import asyncio
import os
import random

import aiohttp
import pytest

from hybrid_pd.proxy.app import serve_in_background
from hybrid_pd.proxy.block_hash import chained_block_hashes
from hybrid_pd.proxy.config import ProxyConfig
from tests.proxy.fakes import run
from tests.support.procs import free_port, worker_argv

pytestmark = pytest.mark.engines
WORDS = "the quick brown fox jumps over the lazy dog prefix cache mamba state attention block".split()


@pytest.fixture(scope="module")
def engine(request):
    if "engines" not in (request.config.option.markexpr or "") and os.environ.get("HYBRID_PD_PROXY_ENGINES") != "1":
        pytest.skip("real engine: run with -m engines or HYBRID_PD_PROXY_ENGINES=1")
    launch, tiny_model = request.getfixturevalue("launch"), request.getfixturevalue("tiny_model")
    port = free_port()
    argv = worker_argv("decode", connector="none", port=port, cpu_bind="1", model=tiny_model)
    proc = launch("proxy-kv-engine", argv, f"http://127.0.0.1:{port}")
    proc.wait_healthy(900)
    return proc.url, f"tcp://127.0.0.1:{argv[argv.index('--kv-events-port') + 1]}"


def text(n_words: int, salt: int) -> str:
    rng = random.Random(salt)
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def test_index_predicts_the_engine_prefix_hit(engine):
    url, events = engine

    async def body():
        config = ProxyConfig.from_flat({"port": 0, "decode": [url], "decode_events": [events],
                                        "decode_policy": "kv_hit", "health_interval": 0})
        async with serve_in_background(config) as proxy, aiohttp.ClientSession() as s:
            index = proxy.state.kv_index

            async def complete(prompt: str) -> dict:
                body = {"model": "tiny", "prompt": prompt, "max_tokens": 2, "temperature": 0.0}
                async with s.post(proxy.url + "/v1/completions", json=body) as r:
                    assert r.status == 200, await r.text()
                    return await r.json()

            salt = 0
            while url not in index.workers:  # slow joiner: the SUB may miss the first requests' events
                salt += 1
                await complete(text(400, salt=1000 + salt))
            prompt = text(700, salt=7)
            async with s.post(url + "/tokenize", json={"model": "tiny", "prompt": prompt}) as r:
                tokens = (await r.json())["tokens"]
            first = await complete(prompt)
            n = first["usage"]["prompt_tokens"]
            assert n == len(tokens) > 512

            def predicted() -> int:
                return index.hit_tokens(url, n, lambda h: chained_block_hashes(tokens, h))
            while predicted() == 0:
                await asyncio.sleep(0.05)
            again = await complete(prompt)
            cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
            kinds = {g.kind for g in index.specs.values()}
            assert {"full_attention", "mamba"} <= kinds, index.specs
            assert predicted() == cached == (n - 1) // 256 * 256
    run(body(), timeout=120)
