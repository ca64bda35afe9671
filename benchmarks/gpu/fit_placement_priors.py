"""Fit the placement model's priors (proxy/placement/cost_model.py: PRIORS) from GPU benchmark results.

    python3 benchmarks/gpu/fit_placement_priors.py [RESULT_DIR ...]     (default: the one-H100 Qwen3-Next runs over
                                                                     cuda_ipc, 2026-11-24)

Reads every part-*.json[.gz] of the folders: the single-request phase probes (each with every server's /metrics
deltas around the request) and the agentic rows (the clients' ITL at c=1 and c=8). Prints the fitted rates, the
observations each came from and the fit's residuals, as JSON. Nothing here needs a GPU.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[1] / "results"
DEFAULT = ["2026-11-24-h100-qwen3next", "2026-11-24-h100-qwen3next-r3", "2026-11-24-h100-qwen3next-r4"]
MB = 1e6


def parts(folder: Path) -> list[dict[str, Any]]:
    out = []
    for f in sorted(folder.glob("part-*.json*")):
        with (gzip.open(f, "rt") if f.suffix == ".gz" else f.open()) as fh:
            out.append(json.load(fh))
    return out


def lstsq(rows: list[list[float]], ys: list[float]) -> list[float]:
    """Least squares by the normal equations (a handful of columns), Gaussian elimination."""
    n = len(rows[0])
    a = [[sum(r[i] * r[j] for r in rows) for j in range(n)] for i in range(n)]
    b = [sum(r[i] * y for r, y in zip(rows, ys)) for i in range(n)]
    for c in range(n):
        p = max(range(c, n), key=lambda i: abs(a[i][c]))
        a[c], a[p], b[c], b[p] = a[p], a[c], b[p], b[c]
        for i in range(n):
            if i != c and a[c][c]:
                f = a[i][c] / a[c][c]
                a[i] = [x - f * y for x, y in zip(a[i], a[c])]
                b[i] -= f * b[c]
    return [b[i] / a[i][i] for i in range(n)]


def nonneg_lstsq(rows: list[list[float]], ys: list[float]) -> list[float]:
    """Least squares with every coefficient >= 0: drop the most negative column and refit until none is."""
    cols = list(range(len(rows[0])))
    while True:
        coef = lstsq([[r[c] for c in cols] for r in rows], ys)
        worst = min(range(len(cols)), key=lambda i: coef[i])
        if coef[worst] >= 0:
            full = [0.0] * len(rows[0])
            for c, v in zip(cols, coef):
                full[c] = v
            return full
        cols.pop(worst)


def engine_steps(end: int, cached: int, block: int) -> int:
    """Steps of a prefill from `cached` to `end` tokens in align mode: one to the last aligned boundary at or below
    the end, one more for the rest (placement.local_steps; chunks never split these prompts: 8,192 per step)."""
    if block <= 0:
        return 1
    boundary = (end // block) * block
    return max(1, (1 if boundary > cached else 0) + (1 if end > max(boundary, cached) else 0))


# 2026-11-25-h100-prefill-steps, torch profiler: 123 ms of GPU kernels for six prefill steps computing
# 4,352 + 505 + 8,160 + 31 + 3,808 + 543 = 17,399 prompt tokens (the steps themselves are CPU-bound).
PROFILED_MS_PER_TOKEN = round(123 / 17399, 5)


def fit(folders: list[Path], per_token: float = PROFILED_MS_PER_TOKEN) -> dict[str, Any]:
    prefill: list[tuple[float, float, int, float, str]] = []  # (computed, cached, engine steps, ms, where)
    hop: list[float] = []
    read: list[tuple[float, float]] = []  # (bytes, seconds)
    pulled: list[tuple[float, float]] = []  # (tokens pulled, bytes)
    itl_engine: list[float] = []
    itl_rows: dict[int, list[float]] = {}
    for folder in folders:
        for part in parts(folder):
            setup, block = part.get("setup", ""), int(part.get("block") or 0)
            for run in part.get("runs", []):
                for row in run.get("rows", []):
                    if row.get("workload") == "agentic" and row.get("itl_s"):
                        itl_rows.setdefault(int(row["concurrency"]), []).append(row["itl_s"] * 1000)
            for probe in part.get("probe", []):
                deltas = probe.get("deltas") or {}
                p, d, front = deltas.get("prefill") or {}, deltas.get("decode") or {}, deltas.get("front") or {}
                where = f"{folder.name}:{setup}:{probe.get('phase')}{probe.get('turn')}"
                # as the proxy sees a prefill: one HTTP call around it (P's call; a colocated turn's TTFT)
                for side, m, seen in (
                    ("prefill", p, p.get("http_request_duration_seconds_sum")),
                    ("engine", front, probe.get("ttft_s")),
                ):
                    computed = m.get("vllm:request_prefill_kv_computed_tokens_sum")
                    if computed and computed > 1 and seen and seen < 0.5:  # > 0.5 s: a first-shape compile
                        cached = m.get("vllm:prefix_cache_hits_total", 0.0)
                        steps = engine_steps(int(cached + computed), int(cached), block)
                        prefill.append((computed, cached, steps, seen * 1000, f"{where}:{side}"))
                nbytes = d.get("vllm:hybrid_pd_bytes_transferred_sum") or d.get("vllm:nixl_bytes_transferred_sum")
                xfer = d.get("vllm:hybrid_pd_xfer_time_seconds_sum") or d.get("vllm:nixl_xfer_time_seconds_sum")
                if nbytes and xfer:
                    read.append((nbytes, xfer))
                    if "hybrid" in setup:
                        d_local = d.get("vllm:prefix_cache_hits_total", 0.0)
                        pulled.append((probe["prompt_tokens"] - 1 - d_local, nbytes))
                itl_n = d.get("vllm:inter_token_latency_seconds_count")
                if itl_n and "colocated" not in setup:
                    itl_engine.append(d["vllm:inter_token_latency_seconds_sum"] / itl_n * 1000)
                p_ms = p.get("http_request_duration_seconds_sum")
                d_step = d.get("vllm:request_prefill_time_seconds_sum")
                if nbytes and xfer and p_ms and d_step and probe.get("ttft_s"):
                    # TTFT - P's call - the READ - D's first step: the second leg and D's queue beyond the READ
                    hop.append((probe["ttft_s"] - p_ms - xfer - d_step) * 1000)
    # prefill(U, C) = steps * step + U * per_token + U * (C + U/2) / 1000 * per_token_per_kctx. Our prompts
    # (1.4k-4.9k computed tokens, two steps each) cannot tell the per-token rate from the steps' noise (+-30%
    # between machines): it is the profiled GPU kernel time per token, and the rest is fitted around it.
    rows = [[float(steps), u * (c + u / 2) / 1000] for u, c, steps, _, _ in prefill]
    ys = [ms - per_token * u for u, _, _, ms, _ in prefill]
    fixed, per_kctx = nonneg_lstsq(rows, ys)
    residuals = [y - (fixed * r[0] + r[1] * per_kctx) for r, y in zip(rows, ys)]
    kv_mb, ckpt = lstsq([[t, 1.0] for t, _ in pulled], [b for _, b in pulled]) if len(pulled) >= 2 else (0, 0)
    c1, c8 = statistics.median(itl_rows.get(1, [0])), statistics.median(itl_rows.get(8, [0]))
    return {
        "rates": {
            "prefill_step_ms": round(fixed, 2),
            "prefill_ms_per_token": per_token,
            "prefill_ms_per_token_per_kctx": round(per_kctx, 6),
            "hop_ms": round(statistics.median(hop), 1) if hop else None,
            "read_ms_per_mb": round(statistics.median(s * 1000 / (b / MB) for b, s in read), 4) if read else None,
            "kv_mb_per_token": round(kv_mb / MB, 5),
            "checkpoint_mb": round(ckpt / MB, 1),
            "step_ms": round(c1, 2),
            "step_ms_per_seq": round(max(0.0, (c8 - c1) / 7), 3),
        },
        "observations": {
            "prefill": len(prefill),
            "prefill_residual_ms_p50_abs": round(statistics.median(abs(r) for r in residuals), 1),
            "hop_ms": sorted(round(h, 1) for h in hop),
            "read": len(read),
            "pulled": len(pulled),
            "client_itl_ms_p50": {"c1": round(c1, 2), "c8": round(c8, 2)},
            "engine_itl_ms_p50_c1": round(statistics.median(itl_engine), 2) if itl_engine else None,
        },
        "prefill_points": [[int(u), int(c), steps, round(ms, 1), where] for u, c, steps, ms, where in prefill],
        "folders": [f.name for f in folders],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", nargs="*", default=DEFAULT)
    args = ap.parse_args(argv)
    folders = [Path(f) if Path(f).is_dir() else RESULTS / f for f in args.folders]
    json.dump(fit(folders), sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
