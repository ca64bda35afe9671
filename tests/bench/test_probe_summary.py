"""benchmarks/gpu/probe_summary.py on a committed device run: the prefill probe's set-ups against upstream's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from benchmarks.gpu.probe_summary import summarize

RUN = Path(__file__).resolve().parents[2] / "benchmarks/results/2026-12-07-h100-nemotronh-prefill-burst-vllm033"


def test_probe_summary_pairs_every_setup_with_upstream_prompt_by_prompt(tmp_path):
    out = summarize(RUN)
    assert out == json.loads((RUN / "results.json").read_text())  # the committed file is this code's output
    assert set(out["setups"]) == {"hybrid", "hybrid-nodigest", "hybrid-plain"}
    assert out["ratios"]["prefill_vs_upstream_prefill"] == out["ratios"]["prefill_vs_upstream_prefill_hybrid"]
    assert all(len(s["burst_last_answer_vs_upstream"]) == 6 for s in out["setups"].values())  # 3 rounds x 2 bursts

    # upstream twice as slow on every prompt: every ratio of ours halves
    shutil.copytree(RUN / "probe", tmp_path / "probe")
    part = tmp_path / "probe" / "prefill-upstream.json"
    run = json.loads(part.read_text())
    for row in run["rows"]:
        row["prefill_ms"] *= 2
        row["wall_ms"] = [w * 2 for w in row["wall_ms"]] if row.get("burst") else row["wall_ms"] * 2
    part.write_text(json.dumps(run))
    slower = summarize(tmp_path)
    for setup, s in slower["setups"].items():
        before = out["setups"][setup]
        assert abs(s["burst_summed_prefill_vs_upstream"] - before["burst_summed_prefill_vs_upstream"] / 2) < 2e-3
        assert abs(s["leg_wall_vs_upstream_median"] - before["leg_wall_vs_upstream_median"] / 2) < 2e-3
    ratio = "prefill_vs_upstream_prefill"
    assert abs(slower["ratios"][ratio] - out["ratios"][ratio] / 2) < 2e-3
