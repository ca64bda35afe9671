"""benchmarks/gpu/placement_log.py reads the lines the proxy's --log-placement writes (proxy/placement/decider.py):
the line is built here by the proxy's own `describe`, so a change of the format fails this test."""

from __future__ import annotations

from benchmarks.gpu.placement_log import summary, table, turns
from hybrid_pd.proxy.placement.cost_model import PRIORS, WorkerView, place
from hybrid_pd.proxy.placement.decider import describe


def test_the_reader_follows_the_proxys_lines():
    busy = place(6615, WorkerView("d", 3808, load=7), [WorkerView("http://p:1", 4352)], PRIORS, aligned_block=544)
    idle = place(6615, WorkerView("d", 3808), [WorkerView("http://p:1", 4352)], PRIORS, aligned_block=544)
    head = "2026-11-26 04:09:08,685 INFO hybrid_pd.proxy: placement"
    lines = [
        f"{head} pd-30ed-7: {describe(idle, 6615)}",
        f"{head} pd-30ed-7: TTFT 90.0 ms (predicted 96.2), local_prefill",
        f"{head} pd-30ed-8: {describe(busy, 6615)}",
        f"{head} pd-30ed-8: TTFT 300.0 ms (predicted 150.0), remote_prefill, P's call 210.5 ms",
    ]
    (d, p) = turns(lines)
    assert (d["id"], d["choice"], round(d["streams"]), d["options"][0]["d"]) == (7, "D", 0, 6615 - 3808)
    assert (p["id"], p["choice"], round(p["streams"]), p["ttft"], p["predicted"]) == (8, "last", 7, 300.0, 150.0)
    assert p["p_ms"] == 210.5 and "p_ms" not in d
    assert len(p["options"]) == 3 and p["options"][2]["name"].endswith("@last")
    assert "| 8 | 6615 | 7 | last |" in table([d, p]) and table([d, p]).endswith("| 300.0 | 210.5 |")
    assert "| last | 1 | 2.00 | 300.0 |" in summary([d, p]) and "| D | 1 | 0.94 | 90.0 |" in summary([d, p])
