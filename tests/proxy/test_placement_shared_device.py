"""The placement model on a shared device (P and D on one GPU): P's prefill stalls D's streams, by a share."""

from __future__ import annotations

import pytest

from hybrid_pd.proxy.placement.cost_model import PRIORS, WorkerView, place, queue_ms


def test_on_a_shared_device_p_s_prefill_stalls_the_decoders_streams():
    """One GPU for P and D (the H100 run of 2026-11-26, c=8): P's prefill of the remote option takes the GPU from
    D's streams, so its stall holds P's compute (not its queue); D alone is unchanged. Request 18 of that run:
    4,718 tokens, nothing cached, one stream on D: without the device term P computed it (measured 363 ms where
    D alone had been predicted at 151); with it D alone wins. (Without the prefiller's queue term, this test's
    subject being the device's: with it, P's queue of two already keeps this turn on D apart.)"""
    d, ps = WorkerView("d", 0, load=1), [WorkerView("p", 0, queued_tokens=3000, load=2)]
    apart = place(4718, d, ps, PRIORS, aligned_block=544, prefiller_queue=False)
    shared = place(4718, d, ps, PRIORS, aligned_block=544, shared_device=True, prefiller_queue=False)
    assert place(4718, d, ps, PRIORS, aligned_block=544).local
    assert apart.prefiller == "p" and shared.local
    assert shared.options[0] == apart.options[0]
    for a, s in zip(apart.options[1:], shared.options[1:]):
        compute = s.prefiller_ms - queue_ms(PRIORS, 3000, 2)
        assert s.stall_ms == pytest.approx(a.stall_ms + compute) and compute > 50
        assert s.gap_ms >= a.gap_ms and s.ttft_ms > a.ttft_ms  # D's stream decodes between P's steps
        assert s.cost_ms == pytest.approx(s.ttft_ms + d.load * s.stall_ms)


def test_on_a_shared_device_the_stall_share_scales_what_p_s_prefill_costs_the_decoders_streams():
    """--shared-device-stall: D's streams wait for that share of P's prefill (its compute, its costliest step
    and D's steps taken from P's), not all of it; the request of the test above, with two streams on D, then goes
    to P at a half share, where it stays on D at a whole one, and the share is clamped to [0, 1]."""
    d, ps = WorkerView("d", 0, load=2), [WorkerView("p", 0, queued_tokens=3000, load=2)]
    kw = {"aligned_block": 544, "prefiller_queue": False}
    apart, half, whole = (place(4718, d, ps, PRIORS, shared_device=s, **kw) for s in (0.0, 0.5, 1.0))
    assert whole.local and half.prefiller == "p" and apart.prefiller == "p"
    for a, h, w in zip(apart.options[1:], half.options[1:], whole.options[1:]):
        assert h.stall_ms - a.stall_ms == pytest.approx((w.stall_ms - a.stall_ms) / 2) and w.stall_ms > a.stall_ms
        assert h.ttft_ms - a.ttft_ms == pytest.approx((w.ttft_ms - a.ttft_ms) / 2)
    assert place(4718, d, ps, PRIORS, shared_device=True, **kw) == whole
    assert place(4718, d, ps, PRIORS, shared_device=3.0, **kw) == whole
    assert place(4718, d, ps, PRIORS, shared_device=-1.0, **kw) == apart
