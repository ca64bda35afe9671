"""benchmarks/gpu/rates_replay.py on the cold-proxy cell of 2026-11-27-h100x2-qwen3next-judged-vllm033-r3 (fresh-c8):
fed as the run's proxy fed its online rates, the replay ends where that proxy's rates ended (the part's
placement_rates), so its other way of learning is a like-for-like alternative."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from benchmarks.gpu.placement_log import proxy_lines
from benchmarks.gpu.rates_replay import replay, report

RUN = Path(__file__).parents[2] / "benchmarks/results/2026-11-27-h100x2-qwen3next-judged-vllm033-r3/fresh-c8"


def test_the_replay_learns_what_the_run_s_proxy_learnt():
    logged = json.loads((RUN / "part-hybrid-pd-1p1d.json").read_text())["runs"][0]["placement_rates"]
    got = replay(proxy_lines(RUN / "hybrid-pd-1p1d-logs.tar.gz"), 544, quiet_only=False)
    rates = got["rates"]
    assert abs(rates.prefill_step_ms / logged["prefill_step_ms"] - 1) < 0.05  # 134.5 against 133.8
    assert abs(rates.hop_ms / logged["hop_ms"] - 1) < 0.05  # 67.6 against 68.2
    assert abs(rates.prefiller_call_factor - logged["prefiller_call_factor"]) < 0.1  # 0.61 against 0.57
    assert len(got["ratios"]["p_call"]) == 19 and statistics.median(got["ratios"]["p_call"]) < 0.5  # P overpriced


def test_learning_from_quiet_turns_prices_p_but_not_the_choice():
    """Fits fed only where D had nothing else of this proxy's to compute price P's calls near what they took (0.91
    against 0.48), and still leave remote turns priced dearer than D alone against what both measured (0.64): not
    adopted (the results folder's summary)."""
    lines = proxy_lines(RUN / "hybrid-pd-1p1d-logs.tar.gz")
    table = report([RUN], 544).splitlines()
    as_run, quiet = (row.split(" | ") for row in table[2:4])
    assert as_run[1] == "as run" and quiet[1] == "quiet"
    assert float(quiet[2].split()[0]) > 0.85 > 0.5 > float(as_run[2].split()[0])
    assert float(quiet[5]) < 0.7 and float(as_run[5]) < 0.7
    hops = [replay(lines, 544, quiet_only=quiet)["rates"].hop_ms for quiet in (True, False)]
    assert hops[0] < 0.8 * hops[1]  # D's queue no longer learnt as the hop


def test_without_the_split_the_replay_fits_a_dearer_step():
    """That run's proxy priced vLLM 0.26's align-mode split (its P calls to N-1 and its D-alone prefills a step
    more than their chunks); replayed without it (`--no-align-split`, the proxy's default since), the same
    measured times spread over fewer steps: each step fits dearer."""
    lines = proxy_lines(RUN / "hybrid-pd-1p1d-logs.tar.gz")
    split, whole = (replay(lines, 544, quiet_only=False, align_split=s)["rates"] for s in (True, False))
    assert split.align_split and not whole.align_split
    assert whole.prefill_step_ms > split.prefill_step_ms
