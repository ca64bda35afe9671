"""benchmarks/gpu/pareto.py: the points of the tok/s-per-GPU against tok/s-per-user plot, from merged tables."""

from __future__ import annotations

from benchmarks.gpu import pareto


def cell(setup: str, c: int, itl_ms: float | None, tok_s: float, workload: str = "agentic", length: int = 8192):
    return {"setup": setup, "workload": workload, "length": length, "concurrency": c, "itl_p50_ms": itl_ms,
            "tok_s": tok_s}


def test_points_per_setup_in_concurrency_order_per_gpu_held(tmp_path):
    res = {"tables": [cell("hybrid-pd-1p1d", 8, 10.0, 800.0), cell("hybrid-pd-1p1d", 1, 5.0, 200.0),
                      cell("colocated", 1, 4.0, 250.0), cell("upstream", 1, None, 100.0),
                      cell("upstream", 8, 8.0, 600.0, workload="long"), cell("colocated", 8, 6.0, 1000.0, length=4096)],
           "args": {"hybrid-pd-1p1d": {"prefill_gpu": 0, "decode_gpu": 1}, "colocated": {"decode_gpu": 1}}}
    got = pareto.points(res, "agentic", 8192)
    assert got == {"hybrid-pd-1p1d": [(1, 200.0, 100.0), (8, 100.0, 400.0)],  # two GPUs: per GPU halves
                   "colocated": [(1, 250.0, 250.0)]}  # no ITL, other workloads and lengths: no point
    res["args"]["hybrid-pd-1p1d"]["decode_gpu"] = 0  # P and D on one GPU
    assert pareto.points(res, "agentic", 8192)["hybrid-pd-1p1d"][1] == (8, 100.0, 800.0)
    assert pareto.plot(res, tmp_path) == ["pareto.png"] and (tmp_path / "pareto.png").stat().st_size > 0
    assert pareto.plot({"tables": []}, tmp_path / "none") == []
