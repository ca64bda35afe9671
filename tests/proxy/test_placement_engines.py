"""The placement model on real engines: a conversation's first turn, with the decoder busy (its engine reports 8
streams), goes to the prefiller, which computes N-1 tokens and ships the checkpoint at the last boundary; the next
turn, which the decoder then holds up to that boundary, is placed on the decoder alone by the model (policy ours,
at its priors, D idle) and answers as one engine does.

Opt-in (engines: ~40 s each; these three are other modules' too, from the session's pool): runs with `-m engines`.
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from hybrid_pd.proxy.app import serve_in_background
from hybrid_pd.proxy.config import ProxyConfig
from hybrid_pd.proxy.kv.block_hash import chained_block_hashes
from hybrid_pd.proxy.placement.online_rates import OnlineRates
from hybrid_pd.proxy.workers import EngineLoad
from tests.proxy.fakes import metric_value, run
from tests.support.conversation import (
    ANSWER_TOKENS,
    assert_same_greedy,
    cached,
    complete,
    greedy_reference,
    text_of,
    tokenize,
)
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


def test_an_agent_loops_next_turn_hits_the_junction_the_prefiller_stopped_at(engine_set, tiny_model):
    """Chat through the proxy, an agent loop whose every turn ends with the same instruction, which the next turn
    drops: turn 2 diverges from the decoder's cache where D holds turn 1's attention blocks but no checkpoint,
    so the flow asks P to stop where turn 2's last message starts (--junction-checkpoints, on by default) and
    ships that state; turn 3, diverging exactly there, straight to D, hits it and answers as one engine."""
    from hybrid_pd.proxy.openai_api import parse_request
    from hybrid_pd.proxy.tokenizer import LocalTokenizer

    engines = engine_set({"ref": ("decode", "none", "1", tiny_model),
                          "p": ("prefill", "hybrid", "0", tiny_model, {"HYBRID_PD_LEASE_S": "10"}),
                          "d": ("decode", "hybrid", "1", tiny_model)})
    system = {"role": "system", "content": text_of(600, 61_000)}
    instruction = {"role": "user", "content": text_of(300, 61_300)}
    steps = [({"role": "assistant", "content": text_of(40, 61_000 + k)},
              {"role": "user", "content": text_of(120, 62_000 + k)}) for k in (1, 2)]
    turns = [[system, instruction], [system, *steps[0], instruction], [system, *steps[0], *steps[1], instruction]]
    local = LocalTokenizer.load(tiny_model)
    chats = [parse_request("chat", json.dumps({"model": "tiny", "messages": t}).encode()) for t in turns]
    ids = [local.tokens(c) for c in chats]
    junction = local.last_message_start(chats[1], ids[1])
    assert junction is not None and ids[2][:junction] == ids[1][:junction]
    engines.up("ref")
    ref = engines["ref"]
    bar = greedy_reference(ref.url, ids[2], ANSWER_TOKENS)
    engines.up("p", "d")
    p, d = engines["p"], engines["d"]

    async def body():
        config = ProxyConfig.from_flat({"port": 0, "prefill": [p.url], "decode": [d.url], "tokenizer": tiny_model,
                                        "prefill_events": [kv_events(p)], "decode_events": [kv_events(d)],
                                        "health_interval": 0, "load_interval": 0})
        async with serve_in_background(config) as proxy, aiohttp.ClientSession() as s:
            index, metrics = proxy.state.kv_index, proxy.state.metrics
            (decoder,) = proxy.state.pool.all("decode")
            decoder.engine = EngineLoad(running=8, waiting=0)  # busy: both turns go to P

            async def chat(messages) -> dict:
                req = {"model": "tiny", "messages": messages, "max_tokens": 2, "temperature": 0.0}
                async with s.post(proxy.url + "/v1/chat/completions", json=req) as r:
                    assert r.status == 200, await r.text()
                    return await r.json()

            salt = 0
            while not (p.url in index.workers and d.url in index.workers):  # slow joiners miss the first events
                salt += 1
                await chat([{"role": "user", "content": text_of(300, 63_000 + salt)}])
            for k, messages in enumerate(turns[:2]):
                said = await chat(messages)
                assert said["usage"]["hybrid_pd"]["computed_on"] == "prefill", (k, said["usage"])
                prompt = ids[k]
                for _ in range(200):  # D's events for what it pulled and computed
                    if index.hit_tokens(d.url, len(prompt), lambda h, t=prompt: chained_block_hashes(t, h)) > 0:
                        break
                    await asyncio.sleep(0.05)
            stops = metric_value(metrics.render().decode(), "hybrid_pd_proxy_junction_stops_total")
            assert stops == 1, metrics.render().decode()  # turn 2's; turn 1 diverged from nothing

        resp = complete(d.url, ids[2], ANSWER_TOKENS, logprobs=2)
        compared = assert_same_greedy(bar, resp, "decoder-alone turn after a junction stop (proxy)")
        print(f"\nturn 3 ({len(ids[2])} tokens) straight to D: {cached(resp)} cached (junction at {junction}: "
              f"{junction // BS * BS}), {compared} of {ANSWER_TOKENS} decided tokens equal to one engine's")
        assert cached(resp) == junction // BS * BS

    run(body(), timeout=300)
