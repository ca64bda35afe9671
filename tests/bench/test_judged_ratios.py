"""benchmarks/gpu/judged.py: each judged ratio's arithmetic over small synthetic parts, through merge.py as the
results folder runs it (parts on disk -> results.json's `ratios`), and one change per ratio that must move it."""

from __future__ import annotations

import copy
import json

import pytest

from benchmarks.gpu import judged, merge

OURS, UP, COL = "hybrid-pd-1p1d", "upstream", "colocated"
ISL, NCT = OURS + "-isl-bounding", OURS + "-non-cached-tokens"


def row(session, turn, ttft_ms, conc=1, gaps=(5.0, 5.0), hit=0, oracle=0, on=None, prompt=8000):
    return {"workload": "agentic", "length": 8192, "concurrency": conc, "session": session, "turn": turn,
            "prompt_tokens": prompt, "hit_tokens": hit, "oracle_hit": oracle, "reported_cached": hit,
            "ttft_s": ttft_ms / 1e3, "itl_s": 0.005, "gaps_ms": list(gaps), "text": "t", "computed_on": on}


def run(rows, conc, tok_s, wall_s=2.0):
    return {"workload": "agentic", "length": 8192, "concurrency": conc, "rows": rows, "wall_s": wall_s, "errors": [],
            "throughput_tok_s": tok_s, "transfer": {"bytes": 0.0, "descriptors": 0.0, "transfers": 0.0,
                                                    "transfer_seconds": 0.0, "failed_transfers": 0.0}}


def part(setup, runs, tag=""):
    return {"setup": setup, "tag": tag, "args": {}, "runs": runs, "probe": [], "errors": [], "device_copy": [],
            "start_s": {}, "block": 544}


def c1(ttfts, on=None, **kw):
    """Two sessions of two turns at c=1 with these TTFTs (ms), in order a/0, a/1, b/0, b/1."""
    keys = [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    return [row(s, t, ms, on=on[i] if on else None, **kw) for i, ((s, t), ms) in enumerate(zip(keys, ttfts))]


@pytest.fixture
def parts():
    """Colocated (the floor), upstream, ours and the two peer-policy variants, at c=1 and c=8 (4 turns each)."""
    eight = lambda ms, gaps=(5.0,): [row(s, t, ms, conc=8, gaps=gaps) for s in "ab" for t in (0, 1)]  # noqa: E731
    return {
        COL: part(COL, [run(c1([90, 95, 90, 95]), 1, 300), run(eight(300), 8, 1000)]),
        UP: part(UP, [run(c1([100, 200, 100, 200]), 1, 200), run(eight(400), 8, 800, wall_s=1.0)]),
        OURS: part(OURS, [run(c1([95, 120, 150, 130], on=["decode", "decode", "prefill", "decode"]), 1, 250),
                          run(eight(300, gaps=(5.0, 80.0)), 8, 400)]),
        ISL: part(OURS, [run(c1([100, 100, 100, 100]), 1, 200), run(eight(300), 8, 500)], tag="-isl-bounding"),
        NCT: part(OURS, [run(c1([100, 100, 100, 100]), 1, 200), run(eight(600), 8, 500)], tag="-non-cached-tokens"),
    }


def merged(tmp_path, parts):
    for name, p in parts.items():
        (tmp_path / f"part-{name}.json").write_text(json.dumps(p))
    return merge.merge(tmp_path, 8192)


def test_worst_vs_upstream_is_the_largest_of_every_cells_ttft_and_throughput_ratios(tmp_path, parts):
    res = merged(tmp_path, parts)
    # c=1: TTFT p50 150/200 (index 2 of 4: the upper middle), p90 150/200, tok/s 200/250; c=8: 300/400, 300/400,
    # tok/s 800/400 = 2.0: the worst
    assert res["ratios"]["worst_vs_upstream"] == pytest.approx(2.0)
    assert res["ratio_basis"]["judged"]["worst_vs_upstream_cell"] == "agentic 8192 c=8 tok_s"
    parts[OURS]["runs"][0]["rows"][2]["ttft_s"] = 0.5  # one slow turn at c=1: its p90 now 500 / 200
    assert merged(tmp_path, parts)["ratios"]["worst_vs_upstream"] == pytest.approx(2.5)


def test_goodput_counts_turns_within_both_bounds_per_wall_second(tmp_path, parts):
    r = merged(tmp_path, parts)["ratios"]
    # ours: c=1 4 good in 2 s; c=8 every turn's ITL p90 is its 80 ms gap (> 50): 0 good. Pooled 4 / 4 s = 1.0.
    # upstream: 4 good in 2 s + 4 good (TTFT 400 <= 500) in 1 s: 8 / 3 s. isl-bounding: 8 / 4 s = 2.0.
    # non-cached-tokens: c=8 TTFT 600 > 500: 4 / 4 s = 1.0. The best peer is upstream.
    assert r["goodput_vs_upstream"] == pytest.approx(1.0 / (8 / 3))
    assert r["goodput_vs_best_peer"] == pytest.approx(1.0 / (8 / 3))
    stalls = copy.deepcopy(parts)
    for row_ in stalls[UP]["runs"][1]["rows"]:
        row_["gaps_ms"] = [5.0] * 8 + [60.0, 60.0]  # p90 (index 9 of 10) 60 ms: upstream's c=8 turns miss the ITL bound
    r = merged(tmp_path, stalls)["ratios"]
    assert r["goodput_vs_upstream"] == pytest.approx(1.0 / (4 / 3))
    assert r["goodput_vs_best_peer"] == pytest.approx(1.0 / 2.0)  # isl-bounding is now the best peer


def test_an_itl_at_the_bound_is_good_and_a_turn_without_gaps_has_none_to_miss():
    assert judged.good(row("a", 0, judged.TTFT_SLO_MS, gaps=[judged.ITL_SLO_MS] * 3))
    assert not judged.good(row("a", 0, judged.TTFT_SLO_MS + 1))
    assert not judged.good(row("a", 0, 100, gaps=[judged.ITL_SLO_MS + 1] * 3))
    assert judged.good(row("a", 0, 100, gaps=[]) | {"itl_s": None})
    assert judged.row_itl_p90_ms(row("a", 0, 100, gaps=[]) | {"itl_s": 0.007}) == pytest.approx(7.0)


def test_dlocal_share_is_ours_over_the_hindsight_oracles(tmp_path, parts):
    # the oracle: colocated (90, 95, 90, 95) against upstream (100, 200, 100, 200): D alone cheaper on all 4 turns;
    # ours served 3 of 4 on D alone
    res = merged(tmp_path, parts)
    assert res["ratios"]["dlocal_share_vs_oracle_c1"] == pytest.approx(0.75)
    assert res["ratio_basis"]["judged"]["dlocal_c1"] | {"ratio": None} == {
        "ratio": None, "turns": 4, "share": 0.75, "oracle_share": 1.0, "agree": 3}
    parts[UP]["runs"][0]["rows"][0]["ttft_s"] = 0.080  # the remote path faster on a/0: the oracle's share 3/4
    res = merged(tmp_path, parts)
    assert res["ratios"]["dlocal_share_vs_oracle_c1"] == pytest.approx(1.0)
    assert res["ratio_basis"]["judged"]["dlocal_c1"]["agree"] == 2  # a/0 and b/0 chosen against the oracle


def test_dlocal_compares_rows_of_the_same_prompt_only(parts):
    other = copy.deepcopy(parts[UP])
    for r in other["runs"][0]["rows"]:
        r["prompt_tokens"] += 1  # another seed's prompts under the same names
    assert judged.oracle_local(parts[COL], other) == {}


def test_misroutes_are_turns_on_d_alone_short_of_the_attention_prefix(tmp_path, parts):
    assert merged(tmp_path, parts)["ratios"]["hybrid_misroutes"] == 0
    ours = parts[OURS]["runs"][0]["rows"]
    ours[1] |= {"hit_tokens": 1088, "oracle_hit": 3264}  # on D alone with 2,176 tokens of attention past its checkpoint
    ours[2] |= {"hit_tokens": 0, "oracle_hit": 3264}  # short too, but served remotely: not D's misroute
    parts[COL]["runs"][0]["rows"][1]["hit_tokens"] = 1088  # one engine that saw every prompt reused no more
    res = merged(tmp_path, parts)
    assert res["ratios"]["hybrid_misroutes"] == 1 and res["ratios"]["hybrid_misroutes_avoidable"] == 0
    assert res["ratio_basis"]["judged"]["hybrid_misroutes"][OURS] == {"turns": 1, "recomputed_tokens": 2176,
                                                                       "inherent": 1}
    parts[COL]["runs"][0]["rows"][1]["hit_tokens"] = 3264  # the colocated engine found a checkpoint there
    res = merged(tmp_path, parts)
    assert res["ratio_basis"]["judged"]["hybrid_misroutes"][OURS]["inherent"] == 0
    assert res["ratios"]["hybrid_misroutes_avoidable"] == 1


def test_the_merge_keeps_the_c1_ttft_ratios_under_their_judged_names(tmp_path, parts):
    r = merged(tmp_path, parts)["ratios"]
    assert r["ttft_p50_vs_colocated_c1"] == pytest.approx(130 / 95)  # upper middles of 4
    assert r["ttft_p50_vs_upstream_c1"] == pytest.approx(130 / 200)


def test_ours_variants_get_their_goodput_shown_and_are_no_peer(tmp_path, parts):
    early = OURS + "-early-decode"
    before = merged(tmp_path, parts)["ratios"]
    eight = [row(s, t, 60, conc=8) for s in "ab" for t in (0, 1)]
    parts[early] = part(OURS, [run(c1([50, 50, 50, 50]), 1, 900, wall_s=0.5), run(eight, 8, 2000, wall_s=0.5)],
                        tag="-early-decode")
    out = merged(tmp_path, parts)
    rates = out["ratio_basis"]["judged"]["goodput_turns_per_s"]
    assert rates[early] == judged.goodput(parts[early], "agentic", 8192)  # shown: 4 good turns in 0.5 s a cell
    assert rates[early]["all"] == 8.0 > max(rates[n]["all"] for n in (UP, ISL, NCT))  # above every peer's
    assert out["ratios"]["goodput_vs_best_peer"] == before["goodput_vs_best_peer"]  # yet no peer
    assert out["ratio_basis"]["judged"]["best_peer"] != early
