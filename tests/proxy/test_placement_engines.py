"""The placement model on real engines: a conversation's first turn, with the decoder busy (its engine reports 8
streams), goes to the prefiller, which computes N-1 tokens and ships the checkpoint at the last boundary; the next
turn, which the decoder then holds up to that boundary, is placed on the decoder alone by the model (policy ours,
at its priors, D idle) and answers as one engine does.

Opt-in (engines: ~40 s each; these three are other modules' too, from the session's pool): runs with `-m engines`.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from hybrid_pd.proxy.app import serve_in_background
from hybrid_pd.proxy.config import ProxyConfig
from hybrid_pd.proxy.kv.block_hash import chained_block_hashes
from hybrid_pd.proxy.placement.online_rates import OnlineRates
from hybrid_pd.proxy.workers import EngineLoad
from tests.proxy.fakes import metric_value, run
from tests.support.conversation import ANSWER_TOKENS, assert_same_greedy, complete, greedy_reference, text_of, tokenize
from tests.support.procs import kv_events
from tests.support.tiny_layout import BS

pytestmark = pytest.mark.engines


def test_a_decoder_alone_turn_the_model_chose_answers_as_one_engine(engine_set, tiny_model):
    engines = engine_set({"ref": ("decode", "none", "1", tiny_model),
                          "p": ("prefill", "hybrid", "0", tiny_model, {"HYBRID_PD_LEASE_S": "10"}),
                          "d": ("decode", "hybrid", "1", tiny_model)})
    engines.up("ref")
    ref = engines["ref"]
    ids = tokenize(ref.url, text_of(600, 29_000))[: 2 * BS + 20]  # 2 blocks and 20 tokens
    first = complete(ref.url, ids, 8, return_token_ids=True)["choices"][0]["token_ids"]
    nxt = ids + first + tokenize(ref.url, " " + text_of(6, 29_001))  # within the same aligned block
    bar = greedy_reference(ref.url, nxt, ANSWER_TOKENS)
    engines.up("p", "d")
    p, d = engines["p"], engines["d"]
    p_events, d_events = kv_events(p), kv_events(d)

    async def body():
        config = ProxyConfig.from_flat({"port": 0, "prefill": [p.url], "decode": [d.url],
                                        "prefill_events": [p_events], "decode_events": [d_events],
                                        "health_interval": 0, "load_interval": 0})
        async with serve_in_background(config) as proxy, aiohttp.ClientSession() as s:
            index, metrics = proxy.state.kv_index, proxy.state.metrics

            async def complete_via_proxy(prompt, **extra) -> dict:
                req = {"model": "tiny", "prompt": prompt, "temperature": 0.0, "ignore_eos": True, **extra}
                async with s.post(proxy.url + "/v1/completions", json=req) as r:
                    assert r.status == 200, await r.text()
                    return await r.json()

            def decisions(label: str) -> float:
                return metric_value(metrics.render().decode(), "hybrid_pd_proxy_disagg_decisions_total",
                                    decision=label)

            (decoder,) = proxy.state.pool.all("decode")
            decoder.engine = EngineLoad(running=8, waiting=0)  # its 8 streams would each wait for a local prefill
            salt = 0
            while not (p.url in index.workers and d.url in index.workers):  # slow joiners miss the first events
                salt += 1
                await complete_via_proxy(text_of(300, 50_000 + salt), max_tokens=2)
            proxy.state.rates = OnlineRates()  # the model at its priors: the joining requests taught it the bed's
            remote = decisions("remote")
            turn = await complete_via_proxy(ids, max_tokens=8, return_token_ids=True)
            decoder.engine = EngineLoad(running=0, waiting=0)
            assert turn["choices"][0]["token_ids"] == first
            assert decisions("remote") == remote + 1  # P computes it, to N-1
            hit = 0
            for _ in range(200):  # D's events for the blocks it pulled and the checkpoint it resumed from
                hit = index.hit_tokens(d.url, len(nxt), lambda h: chained_block_hashes(nxt, h))
                if hit == 2 * BS:
                    break
                await asyncio.sleep(0.05)
            assert hit == 2 * BS, f"the index knows a hit of {hit} on D"
            p_calls = metric_value(metrics.render().decode(), "hybrid_pd_proxy_stage_latency_seconds_count",
                                   stage="prefill")
            local = decisions("local_placement")
            proxy.state.rates = OnlineRates()
            resp = await complete_via_proxy(nxt, max_tokens=ANSWER_TOKENS, logprobs=2)
            assert decisions("local_placement") == local + 1, metrics.render().decode()
            assert metric_value(metrics.render().decode(), "hybrid_pd_proxy_stage_latency_seconds_count",
                                stage="prefill") == p_calls
            usage = resp["usage"]
            assert usage["prompt_tokens_details"]["cached_tokens"] == 2 * BS
            assert usage["hybrid_pd"] == {"prefill_cached_tokens": None, "decoder_cached_tokens": 2 * BS,
                                          "computed_on": "decode"}
            compared = assert_same_greedy(bar, resp, "decoder-alone turn placed by the model")
            print(f"\nturn 2 ({len(nxt)} tokens) on D alone: {usage['prompt_tokens_details']['cached_tokens']} "
                  f"cached, {compared} of {ANSWER_TOKENS} decided tokens equal to one engine's")

    run(body(), timeout=300)
