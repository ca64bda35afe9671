"""The PD policies in the flow, on fake workers and a real KV index: the placement model keeps a warm turn on its
decoder, a turn the index overestimated still completes there (and is counted), the peers' attention-only
deciders misroute hybrid turns (counted per policy), usage carries the billing split, the rates learn."""

from __future__ import annotations

import asyncio
import logging
import re

import aiohttp
import pytest

from hybrid_pd.proxy.kv.events import KVEventBatch
from hybrid_pd.proxy.placement.cost_model import PRIORS
from tests.proxy.fakes import metric_value, run
from tests.proxy.test_kv_routing_flow import HASHES, PROMPT, kv_cluster, post, stored


async def warm(proxy, pub, url, events):
    seq = await pub.send(KVEventBatch(0.0, events))
    await pub.delivered(proxy.state.kv_index, url, seq)


def test_ours_keeps_a_warm_turn_on_its_decoder_and_bills_it_there():
    async def body():
        async with kv_cluster() as (proxy, p, d1, d2, pubs):
            # d2 holds the whole prompt's attention blocks and a checkpoint after block 3: usable hit 12 of 16
            await warm(proxy, pubs[2], d2.url, [stored(HASHES, 0, "full_attention"), stored([HASHES[2]], 1, "mamba")])
            d2.cached_tokens = 12
            status, out = await post(proxy.url, "/v1/completions", {"prompt": PROMPT, "max_tokens": 3})
            assert status == 200 and p.generate_calls == [] and len(d2.generate_calls) == 1
            assert "kv_transfer_params" not in d2.generate_calls[0].body
            assert out["usage"]["prompt_tokens_details"]["cached_tokens"] == 12  # D's own figure, untouched
            assert out["usage"]["hybrid_pd"] == {"prefill_cached_tokens": None, "decoder_cached_tokens": 12,
                                                 "computed_on": "decode"}
            m = proxy.state.metrics.render().decode()
            assert metric_value(m, "hybrid_pd_proxy_disagg_decisions_total", decision="local_placement") == 1
            assert metric_value(m, "hybrid_pd_proxy_hit_mispredictions_total") == 0
    run(body())


def test_a_turn_the_index_overestimated_completes_on_the_decoder_and_is_counted():
    async def body():
        async with kv_cluster() as (proxy, p, d1, d2, pubs):
            await warm(proxy, pubs[2], d2.url, [stored(HASHES, 0, "full_attention"), stored([HASHES[2]], 1, "mamba")])
            d2.cached_tokens = 4  # evicted since: D really holds one block
            status, out = await post(proxy.url, "/v1/completions", {"prompt": PROMPT, "max_tokens": 3})
            assert status == 200 and p.generate_calls == [] and out["choices"][0]["text"] == "Hello"
            m = proxy.state.metrics.render().decode()
            assert metric_value(m, "hybrid_pd_proxy_hit_mispredictions_total", role="decode") == 1
            assert metric_value(m, "hybrid_pd_proxy_hit_mispredicted_tokens_total", role="decode") == 8
    run(body())


def test_the_peers_deciders_misroute_a_hybrid_turn_ours_does_not():
    """d2 holds 3 of the prompt's 4 attention blocks but a checkpoint only after the first: usable hit 4 of 16.
    Dynamo's and llm-d's rules see 12 cached (4 uncached) and keep the turn on d2, which recomputes 8 of the
    tokens they counted; ours decides on the 4 it can use, and is never misled."""
    async def body(policy: str, expected: str, misroutes: int):
        async with kv_cluster(pd_policy=policy, non_cached_tokens=8) as (proxy, p, d1, d2, pubs):
            await warm(proxy, pubs[2], d2.url, [stored(HASHES[:3], 0, "full_attention"),
                                                stored([HASHES[0]], 1, "mamba")])
            status, _ = await post(proxy.url, "/v1/completions", {"prompt": PROMPT, "max_tokens": 3})
            assert status == 200 and len(d2.generate_calls) == 1
            m = proxy.state.metrics.render().decode()
            assert metric_value(m, "hybrid_pd_proxy_disagg_decisions_total", decision=expected) == 1
            assert metric_value(m, "hybrid_pd_proxy_hybrid_misroutes_total", policy=policy) == misroutes
            assert metric_value(m, "hybrid_pd_proxy_hybrid_misroute_recomputed_tokens_total") == 8 * misroutes
            assert len(p.generate_calls) == (1 if expected == "remote" else 0)

    run(body("isl-bounding", "local_isl_bounding", 1))
    run(body("non-cached-tokens", "local_non_cached", 1))
    run(body("ours", "local_placement", 0))
    run(body("always-remote", "remote", 0))


def test_a_pd_turn_bills_what_each_side_hit():
    async def body():
        async with kv_cluster(pd_policy="always-remote") as (proxy, p, d1, d2, pubs):
            await warm(proxy, pubs[2], d2.url, [stored(HASHES[:2], 0, "full_attention"),
                                                stored([HASHES[1]], 1, "mamba")])
            p.cached_tokens = 4
            status, out = await post(proxy.url, "/v1/completions", {"prompt": PROMPT, "max_tokens": 3})
            assert status == 200 and len(p.generate_calls) == 1
            assert out["usage"]["prompt_tokens_details"]["cached_tokens"] == 8  # max(P's 4, D's own 8)
            assert out["usage"]["hybrid_pd"] == {"prefill_cached_tokens": 4, "decoder_cached_tokens": 8,
                                                 "computed_on": "prefill"}
        async with kv_cluster(pd_policy="always-remote", usage_breakdown=False) as (proxy, p, d1, d2, pubs):
            status, out = await post(proxy.url, "/v1/completions", {"prompt": PROMPT, "max_tokens": 3})
            assert status == 200 and "hybrid_pd" not in out["usage"]
    run(body())


def test_the_rates_learn_from_streamed_turns():
    async def body():
        async with kv_cluster() as (proxy, p, d1, d2, pubs):
            await warm(proxy, pubs[2], d2.url, [stored(HASHES, 0, "full_attention"), stored([HASHES[2]], 1, "mamba")])
            async with aiohttp.ClientSession() as s:
                for _ in range(3):
                    r = await s.post(proxy.url + "/v1/completions", json={
                        "prompt": PROMPT, "stream": True, "stream_options": {"include_usage": True}})
                    assert r.status == 200
                    await r.read()
            rates = proxy.state.rates
            assert rates.observations["prefill"] == 3 and rates.observations["step"] == 3
            assert rates.observations["prefiller_call"] == 0 and rates.rates.prefiller_call_factor == 1.0  # D alone
            # the fake answers in well under a millisecond: the fits move towards it from the GPU priors
            assert rates.rates.prefill_step_ms < PRIORS.prefill_step_ms and rates.rates.step_ms < PRIORS.step_ms
            m = proxy.state.metrics.render().decode()
            assert metric_value(m, "hybrid_pd_proxy_placement_observations", fit="prefill") == 3
            assert metric_value(m, "hybrid_pd_proxy_placement_rate", rate="hop_ms") == PRIORS.hop_ms  # no PD turn yet
    run(body())


def test_a_decoder_alone_turn_teaches_the_prefill_only_where_it_ran_alone():
    """--learn-local-alone: a turn D served alone while another request was on D (its TTFT queued behind that one's
    steps) teaches the decode step, not the prefill rates; one alone on D teaches both. Off, both teach the prefill
    (test_the_rates_learn_from_streamed_turns)."""
    async def body(learn_local_alone: bool) -> int:
        async with kv_cluster(learn_local_alone=learn_local_alone) as (proxy, p, d1, d2, pubs):
            await warm(proxy, pubs[2], d2.url, [stored(HASHES, 0, "full_attention"), stored([HASHES[2]], 1, "mamba")])
            decoder = next(w for w in proxy.state.pool.all("decode") if w.url == d2.url)
            async with aiohttp.ClientSession() as s:
                for others in (0, 1, 0):
                    decoder.in_flight += others  # another request of this proxy on D meanwhile
                    r = await s.post(proxy.url + "/v1/completions", json={
                        "prompt": PROMPT, "stream": True, "stream_options": {"include_usage": True}})
                    assert r.status == 200
                    await r.read()
                    decoder.in_flight -= others
            assert p.generate_calls == [] and len(d2.generate_calls) == 3
            assert proxy.state.rates.observations["step"] == 3
            return proxy.state.rates.observations["prefill"]

    assert run(body(True)) == 2
    assert run(body(False)) == 3


def test_a_turn_right_after_another_does_not_see_it_running():
    """Worker.streams (what placement reads): the engine's figures, plus this proxy's requests sent since they
    were read, less those that ended since (Worker.load, for routing, keeps counting them until the next read)."""
    from hybrid_pd.proxy.workers import EngineLoad, Worker, WorkerPool

    w = Worker("http://d", "decode", engine=EngineLoad(running=1, waiting=0))
    with WorkerPool.busy(w):
        assert w.streams == 2 and w.load == 2
    assert w.streams == 1 and w.load == 2
    w.engine, w.sent_since_read, w.done_since_read = None, 0, 0
    assert w.streams == 0


def test_a_busy_decoder_has_the_prefiller_compute_to_n_minus_1(caplog):
    """With D's 7 streams waiting for any step it takes, the tail after P's boundary would cost them a prefill
    step each: ours sends the turn to P and asks it (PREFILL_STOP in P's kv_transfer_params) to stop at N-1, so
    that D's last token rides in a decode step. An idle D computes the same cold prompt alone."""
    from hybrid_pd.connector.contract import PREFILL_STOP, STOP_LAST
    from hybrid_pd.proxy.workers import EngineLoad

    async def body(streams: int):
        async with kv_cluster(log_placement=True) as (proxy, p, d1, d2, pubs):
            p.extra_ktp = {"engine_splits": True, "prefill_steps": 7}  # as our P says: its engine's split, its steps
            seen = []
            learn, rates = proxy.state.rates.observe_prefill, proxy.state.rates
            rates.observe_prefill = lambda tokens, context, steps, ms: (seen.append(steps),
                                                                        learn(tokens, context, steps, ms))
            for w in proxy.state.pool.all("decode"):
                w.engine = EngineLoad(running=streams, waiting=0)
            async with aiohttp.ClientSession() as s:
                streamed = {"prompt": PROMPT, "max_tokens": 3, "stream": True}
                r = await s.post(proxy.url + "/v1/completions", json=streamed)
                assert r.status == 200 and "[DONE]" in await r.text()
            calls = proxy.state.rates.observations["prefiller_call"]
            split = metric_value(proxy.state.metrics.render().decode(), "hybrid_pd_proxy_placement_rate",
                                 rate="align_split")
            assert (seen == [7]) == bool(streams)  # the fit took P's own count of its steps (P ran the call alone)
            return [c.body["kv_transfer_params"] for c in p.generate_calls], calls, proxy.state.rates.rates, split

    caplog.set_level(logging.INFO, logger="hybrid_pd.proxy")
    params, calls, rates, split = run(body(0))
    assert (params, calls, rates.align_split, split) == ([], 0, False, 0)  # the setting's: no prefiller said yet
    (params,), calls, rates, split = run(body(7))
    assert params[PREFILL_STOP] == STOP_LAST and params["do_remote_decode"] is True
    assert rates.align_split is True and split == 1  # P's answer said so: later turns priced with the split
    # the fake P answers in a few ms where the priors price 2 steps of a GPU engine: the factor on P's call drops
    assert calls == 1 and rates.prefiller_call_factor < 1.0
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("placement ")]
    assert len(said) == 4 and "-> D (local_fastest)" in said[0] and "@last (remote_fastest)" in said[2]
    assert "local_prefill, P factor 1.000" in said[1]
    assert "remote_prefill, P's call " in said[3] and f"P factor {rates.prefiller_call_factor:.3f}" in said[3]
    assert re.search(r"P's call [\d.]+ ms \(priced [\d.]+\)", said[3])


def test_prefiller_stop_names_where_p_stops_for_every_policy(caplog):
    """--prefiller-stop: `model` leaves the stop to ours' cost model (a busy D: N-1, as above) and to the prefiller's
    own setting under the peers' deciders (no PREFILL_STOP sent); `boundary` and `last` are sent with every remote
    turn, ours' options narrowed to that stop (2026-11-27-h100x2-qwen3next-pd-tax-vllm033: the A/B of a stop on
    the same engines)."""
    from hybrid_pd.connector.contract import PREFILL_STOP

    async def body(policy: str, stop: str, streams: int):
        async with kv_cluster(pd_policy=policy, prefiller_stop=stop, log_placement=True) as (proxy, p, d1, d2, pubs):
            # P's events tell the proxy the groups (the aligned block: 4 tokens, a boundary 4 tokens below the end)
            await warm(proxy, pubs[0], p.url, [stored(HASHES[:1], 0, "full_attention"), stored(HASHES[:1], 1, "mamba")])
            for w in proxy.state.pool.all("decode"):
                w.engine = EngineLoad(running=streams, waiting=0)
            status, _ = await post(proxy.url, "/v1/completions", {"prompt": PROMPT, "max_tokens": 3})
            assert status == 200
            return [c.body["kv_transfer_params"].get(PREFILL_STOP) for c in p.generate_calls]

    from hybrid_pd.proxy.workers import EngineLoad

    def options() -> set[str]:
        said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("placement ") and " -> " in
                r.getMessage()]
        caplog.clear()
        return set(re.findall(r"@(boundary|last) ttft", said[-1]))

    caplog.set_level(logging.INFO, logger="hybrid_pd.proxy")
    assert run(body("always-remote", "model", 0)) == [None]
    assert run(body("always-remote", "last", 0)) == ["last"]
    assert run(body("always-remote", "boundary", 0)) == ["boundary"]
    caplog.clear()
    assert run(body("ours", "model", 7)) == ["last"] and options() == {"boundary", "last"}
    # ours with the boundary named: its only remote option; D's tail after it stalls D's 7 streams as D alone
    # would, so D serves the turn
    assert run(body("ours", "boundary", 7)) == [] and options() == {"boundary"}
    assert run(body("ours", "last", 7)) == ["last"] and options() == {"last"}


def test_a_turn_d_serves_alone_queues_its_uncached_tokens_on_d_until_its_first_token():
    """What the next turn's placement reads as D's queue (its WorkerView's queued_tokens): a turn D serves alone
    counts the prompt tokens D still computes for it from the moment it is sent until its first token, so that
    turns placed milliseconds apart price each other's prefill (the 2026-11-26 H100 run at c=8 placed three turns
    on one decoder within 11 ms, each priced as if D were idle)."""
    async def body():
        async with kv_cluster() as (proxy, p, d1, d2, pubs):
            # d2 holds 12 of the prompt's 16 tokens (attention and a checkpoint after block 3): D alone computes 4
            await warm(proxy, pubs[2], d2.url, [stored(HASHES, 0, "full_attention"), stored([HASHES[2]], 1, "mamba")])
            d2.hang = True
            worker = next(w for w in proxy.state.pool.all("decode") if w.url == d2.url)
            async with aiohttp.ClientSession() as s:
                task = asyncio.ensure_future(s.post(proxy.url + "/v1/completions", json={
                    "prompt": PROMPT, "max_tokens": 3, "stream": True}))
                await asyncio.wait_for(d2.received.wait(), 10)
                assert p.generate_calls == [] and worker.queued_tokens == 4  # sent, no first token yet
                d2.release.set()
                r = await task
                assert r.status == 200 and "[DONE]" in await r.text()
            assert worker.queued_tokens == 0
    run(body())


def test_each_placed_turn_feeds_q_and_d_alone_carries_the_next_turns_term_unless_switched_off(caplog):
    """The decider feeds q (the share of turns that went on on a prefiller) once per turn it places, and D alone's
    option carries the next turn's term: cost = TTFT + q * f * P's prefill of the remote option's tokens (D idle: no
    stall term). With --no-next-turn the same q leaves D alone's cost at its TTFT. A busy D sends the turn on: P's
    hit on the prompt (its first 2 blocks) makes it one that went on on a prefiller."""
    from hybrid_pd.proxy.workers import EngineLoad

    async def body(next_turn: bool, streams: int):
        async with kv_cluster(log_placement=True, next_turn=next_turn, align_split=True) as (proxy, p, d1, d2, pubs):
            held = [stored(HASHES[:2], 0, "full_attention"), stored([HASHES[1]], 1, "mamba")]
            await warm(proxy, pubs[0], p.url, held)
            for w in proxy.state.pool.all("decode"):
                w.engine = EngineLoad(running=streams, waiting=0)
            for w in proxy.state.pool.all("prefill"):  # P busy with one request: an idle D's turn stays on D, where
                w.engine = EngineLoad(running=1, waiting=0)  # q's term (~0.9 of P's prefill) would tip it to P
            for _ in range(10):
                proxy.state.rates.observe_turn(continued=True, remote=True)
            q = proxy.state.rates.rates.next_remote
            status, _ = await post(proxy.url, "/v1/completions", {"prompt": PROMPT, "max_tokens": 3})
            assert status == 200
            return q, proxy.state.rates.rates.next_remote, len(p.generate_calls)

    caplog.set_level(logging.INFO, logger="hybrid_pd.proxy")
    for next_turn in (True, False):
        caplog.clear()
        q, after, calls = run(body(next_turn, 0))
        assert q > 0.85 and after == pytest.approx(0.8 * q) and calls == 0  # D alone: it did not go on on P
        said = next(r.getMessage() for r in caplog.records if " -> D " in r.getMessage())
        ttft, cost = map(float, re.search(r"; D ttft ([\d.]+) stall [\d.]+ cost ([\d.]+)", said).groups())
        assert (cost > ttft + 1) if next_turn else cost == ttft
    q, after, calls = run(body(True, 16))
    assert calls == 1 and after == pytest.approx(q + 0.2 * (1 - q))


def test_only_a_policy_that_never_serves_d_alone_tells_p_to_ship_no_checkpoint():
    """always-remote marks P's request SHIP_CHECKPOINT False: no turn on D alone will resume from a checkpoint
    (connector/contract.py); ours, whose next turns on D alone do, leaves P's own setting."""
    from hybrid_pd.connector.contract import SHIP_CHECKPOINT
    from hybrid_pd.proxy.workers import EngineLoad

    async def body(policy: str):
        async with kv_cluster(pd_policy=policy, prefiller_stop="last") as (proxy, p, d1, d2, pubs):
            await warm(proxy, pubs[0], p.url, [stored(HASHES[:1], 0, "full_attention"), stored(HASHES[:1], 1, "mamba")])
            for w in proxy.state.pool.all("decode"):
                w.engine = EngineLoad(running=7, waiting=0)  # a busy D: ours goes to P too
            status, _ = await post(proxy.url, "/v1/completions", {"prompt": PROMPT, "max_tokens": 3})
            assert status == 200 and len(p.generate_calls) == 1
            return p.generate_calls[0].body["kv_transfer_params"].get(SHIP_CHECKPOINT, "unmarked")

    assert run(body("always-remote")) is False
    assert run(body("ours")) == "unmarked"
