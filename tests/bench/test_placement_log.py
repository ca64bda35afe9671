"""benchmarks/gpu/placement_log.py reads the lines the proxy's --log-placement writes (proxy/placement/decider.py):
the line is built here by the proxy's own `describe`, so a change of the format fails this test."""

from __future__ import annotations

from pathlib import Path

from benchmarks.gpu.placement_log import proxy_lines, summary, table, turns
from hybrid_pd.proxy.placement.cost_model import PRIORS, WorkerView, place
from hybrid_pd.proxy.placement.decider import describe, outcome

H200_RUN = Path(__file__).parents[2] / "benchmarks/results/2026-11-26-h200-qwen3next-placement"
H200_LOG = H200_RUN / "hybrid-pd-1p1d-logs.tar.gz"


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


def test_the_reader_shows_p_s_call_as_predicted_and_the_factor_where_the_log_has_them():
    """The outcome line (decider.outcome) carries what the option priced P's call at and the factor after the turn;
    P's call as predicted is that price times the factor in force at the decision (the last logged before it)."""
    busy = place(6615, WorkerView("d", 3808, load=7), [WorkerView("http://p:1", 4352)], PRIORS, aligned_block=544)
    idle = place(6615, WorkerView("d", 3808), [WorkerView("http://p:1", 4352)], PRIORS, aligned_block=544)
    head = "2026-11-26 04:09:08,685 INFO hybrid_pd.proxy: placement"
    priced = busy.chosen.prefiller_ms
    lines = [
        f"{head} pd-30ed-7: {describe(busy, 6615)}",
        f"{head} pd-30ed-7: {outcome(busy.chosen, 300.0, 'remote_prefill', 2 * priced, 1.5)}",
        f"{head} pd-30ed-8: {describe(idle, 6615)}",
        f"{head} pd-30ed-9: {describe(busy, 6615)}",
        f"{head} pd-30ed-8: {outcome(idle.chosen, 90.0, 'local_prefill', None, 1.5)}",
        f"{head} pd-30ed-9: {outcome(busy.chosen, 200.0, 'remote_prefill', 1.5 * priced, 1.5)}",
    ]
    first, d, second = turns(lines)
    assert first["p_predicted"] == round(priced, 1) and first["factor"] == 1.5  # decided at the neutral factor
    assert second["p_predicted"] == round(priced, 1) * 1.5 and "p_predicted" not in d and d["factor"] == 1.5
    rows = table([first, d, second]).splitlines()
    assert rows[0].endswith("| P's call | P's call predicted | factor after |") and rows[1].count("---") == 10
    assert rows[3].endswith("| - | - | 1.500 |")
    assert summary([first, d, second]).splitlines()[-1].endswith(" 1.50 |")  # median of 2.0 and 1.0


def test_a_log_from_before_the_factor_reads_as_it_did():
    rows = turns(proxy_lines(H200_LOG))
    assert len(rows) == 56 and not any("factor" in r or "p_predicted" in r for r in rows)
    assert table(rows).splitlines()[0].endswith("| P's call |")
    assert summary(rows).splitlines()[-2:] == ["| D | 28 | 1.01 | 122.0 |", "| last | 28 | 1.48 | 380.8 |"]


def test_the_reader_takes_the_prefillers_queue_term_where_the_line_has_it():
    """A remote option's delay of the requests queued behind it on P (cost_model's `behind_ms`, in its cost) ends the
    option when it is not 0; a log that carries it tells cell_timeline not to replay the term on top of it."""
    from benchmarks.gpu.cell_timeline import queue_term_on

    queued = place(6615, WorkerView("d", 3808, load=3), [WorkerView("http://p:1", 3808, load=4)], PRIORS,
                   aligned_block=544)
    head = "2026-11-27 04:09:08,685 INFO hybrid_pd.proxy: placement"
    (turn,) = turns([f"{head} pd-30ed-7: {describe(queued, 6615)}"])
    behind = [o["behind"] for o in turn["options"]]
    assert behind[0] == 0.0 and all(b == round(o.behind_ms, 1) > 0 for b, o in zip(behind[1:], queued.options[1:]))
    assert queue_term_on({}, {1: turn})
    old = {"date": "2026-11-26 16:35 UTC", "args": {"proxy_args": ""}}
    without = dict(turn, options=[dict(o, behind=0.0) for o in turn["options"]])
    assert not queue_term_on(old, {1: without})  # before the term: the replay adds it
    assert not queue_term_on(dict(old, date="2026-11-27 02:32 UTC", args={"proxy_args": "--no-prefiller-queue"}),
                             {1: without})
