"""Fleet simulator: what hybrid-aware routing and placement are worth at 8-32 prefillers and decoders, with
engines modelled by cost curves fitted to our GPU runs and the proxy's own routing code deciding
(fleetsim_core.py; docs/benchmarks.md, "Fleet simulator", says what it leaves out).

    python -m benchmarks.fleetsim validate --out DIR        # the GPU 1P1D runs, measured vs simulated
    python -m benchmarks.fleetsim fleet --out DIR           # 8P8D / 16P16D / 32P32D x loads x policies
    python -m benchmarks.fleetsim generate --out trace.jsonl [--sessions N --rate R ...]
    python -m benchmarks.fleetsim replay TRACE --fit RESULTS_DIR --prefillers 8 --decoders 8 [--closed-loop]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

from proxy.config.sections import DisaggConfig

from .fleetsim_core import ClosedLoop, FleetConfig, Result, Sim
from .fleetsim_model import CostModel, fit, load_part
from .fleetsim_policies import POLICIES
from .fleetsim_trace import AgenticParams, agentic, bench_sessions, dump, load

GPU = Path("benchmarks/results")  # from the repository root, as the recorded `source` says
# The runs validated against: how the proxy decided there (the load-aware rule landed between them), and whether
# P stopped at the block boundary (True) or computed N-1 tokens.
VALIDATION: dict[str, tuple[DisaggConfig, bool]] = {
    "2026-11-24-h200x2-qwen3next": (DisaggConfig(load_aware=False), False),
    "2026-11-24-h200x2-nemotronh": (DisaggConfig(load_aware=False), False),
    "2026-11-24-h100-qwen3next-r2": (DisaggConfig(), False),
    "2026-11-24-h100-qwen3next-r4": (DisaggConfig(), False),
    "2026-11-25-h100-qwen3next-boundary": (DisaggConfig(), True),
}
FLEET_COST = "2026-11-24-h200x2-qwen3next"  # P and D on GPUs of their own, as in a fleet


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def measured_pct(xs: list[float], q: float) -> float:
    """merge.py's percentile (statistics.quantiles, inclusive), for a like-for-like comparison."""
    if len(xs) < 2:
        return xs[0] if xs else float("nan")
    return statistics.quantiles(xs, n=100, method="inclusive")[int(q * 100) - 1]


# ---- validation ---------------------------------------------------------------------------------------------
CALIBRATION = 8  # the loaded runs (this concurrency, every length) s1 and s3 are fitted to; the others are not
S1_GRID = [i * 1e-6 for i in range(0, 16, 2)]  # s per prefill token in a step
S3_GRID = [i * 0.005 for i in range(9)]  # s per request prefilling in a step, past the first


def hybrid_part(folder: Path) -> Path:
    return next(folder.glob("part-hybrid-pd-1p1d.json*"), None) or next(folder.glob("part-hybrid-pd-1p1d-run-b.json*"))


def simulate_run(cost: CostModel, run: dict, disagg: DisaggConfig, p_to_boundary: bool = False) -> Sim:
    """The GPU benchmark's run replayed: 1P1D, its sessions closed loop at its concurrency."""
    sim = Sim(cost, FleetConfig(1, 1, cache_tokens=10**8, p_to_boundary=p_to_boundary, disagg=disagg), POLICIES["ours"])
    ClosedLoop(sim, bench_sessions(run["rows"], cost.block), slots=run["concurrency"])
    sim.run()
    return sim


def calibrate(folder: Path, disagg: DisaggConfig, p_to_boundary: bool = False) -> CostModel:
    """fit(folder), with s1 and s3 (what single requests cannot show: the cost of a fuller step) chosen on a grid
    so that the simulated TTFT p50 of the calibration runs matches the measured (sum of relative errors)."""
    cost = fit(folder)
    runs = [
        r
        for r in load_part(hybrid_part(folder))["runs"]
        if r["workload"] == "agentic" and r["concurrency"] == CALIBRATION
    ]
    measured = [measured_pct([r["ttft_s"] for r in run["rows"]], 0.5) for run in runs]

    def err(knobs: tuple[float, float]) -> float:
        c = replace(cost, s1=knobs[0], s3=knobs[1])
        return sum(
            abs(
                measured_pct([r.ttft for r in simulate_run(c, run, disagg, p_to_boundary).results if r.ttft], 0.5) / m
                - 1
            )
            for run, m in zip(runs, measured)
        )

    if not runs:
        return cost
    s1, s3 = min(((a, b) for a in S1_GRID for b in S3_GRID), key=err)
    return replace(cost, s1=s1, s3=s3)


def validate(out: Path) -> dict:
    rows, costs = [], {}
    for name, (disagg, to_boundary) in VALIDATION.items():
        folder = GPU / name
        cost = calibrate(folder, disagg, to_boundary)
        costs[name] = cost.as_dict()
        part = load_part(hybrid_part(folder))
        for run in part["runs"]:
            if run["workload"] != "agentic":
                continue
            sim = simulate_run(cost, run, disagg, to_boundary)
            m_ttft = [r["ttft_s"] for r in run["rows"] if r["ttft_s"] is not None]
            s_ttft = [r.ttft for r in sim.results if r.ttft is not None]
            transfers = run.get("transfer", {}).get("transfers")
            m_local = len(run["rows"]) - int(transfers) if transfers is not None else None
            row = {
                "run": name,
                "part": hybrid_part(folder).name,
                "length": run["length"],
                "c": run["concurrency"],
                "requests": len(m_ttft),
                "fitted": run["concurrency"] == CALIBRATION,
                "ttft_p50_ms": [measured_pct(m_ttft, 0.5) * 1e3, measured_pct(s_ttft, 0.5) * 1e3],
                "ttft_p90_ms": [measured_pct(m_ttft, 0.9) * 1e3, measured_pct(s_ttft, 0.9) * 1e3],
                "hit_rate": [
                    sum(r["hit_tokens"] or 0 for r in run["rows"]) / sum(r["prompt_tokens"] for r in run["rows"]),
                    sum(r.reported for r in sim.results) / sum(r.req.input_length for r in sim.results),
                ],
                "d_local_turns": [m_local, sum(1 for r in sim.results if not r.remote)],
            }
            rows.append(row)
            print(
                f"{name} L={row['length']} c={row['c']}: TTFT p50 {row['ttft_p50_ms'][0]:.0f} / "
                f"{row['ttft_p50_ms'][1]:.0f} ms, p90 {row['ttft_p90_ms'][0]:.0f} / {row['ttft_p90_ms'][1]:.0f}, "
                f"hits {row['hit_rate'][0]:.3f} / {row['hit_rate'][1]:.3f}, D-local {row['d_local_turns']}"
            )
    out.mkdir(parents=True, exist_ok=True)
    (out / "validation.json").write_text(
        json.dumps({"rows": rows, "cost_models": costs, "calibration_run": CALIBRATION}, indent=1)
    )
    return {"rows": rows, "cost_models": costs}


# ---- fleet --------------------------------------------------------------------------------------------------
def fleet_params(pairs: int, rate_per_pair: float, seed: int) -> AgenticParams:
    """Sessions arriving over 150 s; system prompts grow with the fleet (more tenants)."""
    return AgenticParams(
        sessions=int(rate_per_pair * pairs * 150), rate_per_s=rate_per_pair * pairs, system_prompts=4 * pairs, seed=seed
    )


def summarize(results: list[Result], slo_ttft: float, slo_tpot: float) -> dict:
    ttft = [r.ttft for r in results if r.ttft is not None]
    t0 = min(r.arrival for r in results)
    t1 = max(r.arrival for r in results)
    good = 0
    for r in results:
        out = r.req.output_length
        tpot = (r.e2e - r.ttft) / (out - 1) if r.e2e is not None and r.ttft is not None and out > 1 else 0.0
        if r.ttft is not None and r.ttft <= slo_ttft and tpot <= slo_tpot:
            good += 1
    prompt = sum(r.req.input_length for r in results)
    return {
        "requests": len(results),
        "goodput_rps": good / max(1e-9, t1 - t0),
        "slo_met": good / len(results),
        "ttft_p50_ms": pct(ttft, 0.5) * 1e3,
        "ttft_p90_ms": pct(ttft, 0.9) * 1e3,
        "hit_rate": sum(r.hit for r in results) / prompt,
        "oracle_rate": sum(r.oracle for r in results) / prompt,
        "remote_share": sum(r.remote for r in results) / len(results),
        "read_gb": sum(r.read_bytes for r in results) / 1e9,
    }


def run_fleet(cost: CostModel, pairs: int, rate: float, policy: str, args: argparse.Namespace) -> dict:
    reqs = agentic(fleet_params(pairs, rate, args.seed))
    sim = Sim(cost, FleetConfig(pairs, pairs, cache_tokens=args.cache_tokens), POLICIES[policy])
    ClosedLoop(sim, reqs)
    began = time.process_time()
    sim.run()
    row = {"pairs": pairs, "rate_per_pair": rate, "policy": policy} | summarize(
        sim.results, args.slo_ttft, args.slo_tpot
    )
    row["cpu_s"] = time.process_time() - began
    return row


def fleet(args: argparse.Namespace) -> list[dict]:
    cost = replace(calibrate(GPU / FLEET_COST, *VALIDATION[FLEET_COST]), max_seqs=args.max_seqs)
    rows = []
    for pairs in args.sizes:
        for rate in args.rates:
            for policy in args.policies:
                row = run_fleet(cost, pairs, rate, policy, args)
                rows.append(row)
                print(
                    f"{pairs}P{pairs}D rate {rate}/s/pair {policy:17s} goodput {row['goodput_rps']:6.2f} rps "
                    f"SLO met {row['slo_met']:.3f} TTFT p50 {row['ttft_p50_ms']:7.0f} p90 {row['ttft_p90_ms']:7.0f} "
                    f"hits {row['hit_rate']:.3f} (oracle {row['oracle_rate']:.3f}) remote {row['remote_share']:.2f} "
                    f"[{row['requests']} req, {row['cpu_s']:.1f} s CPU]",
                    flush=True,
                )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fleet.json").write_text(
        json.dumps(
            {
                "cost_model": cost.as_dict(),
                "rows": rows,
                "slo": {"ttft_s": args.slo_ttft, "tpot_s": args.slo_tpot},
                "cache_tokens": args.cache_tokens,
            },
            indent=1,
        )
    )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("validate")
    v.add_argument("--out", type=Path, required=True)
    f = sub.add_parser("fleet")
    f.add_argument("--out", type=Path, required=True)
    f.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[8, 16, 32])
    f.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")], default=[0.5, 1.0, 1.5])
    f.add_argument("--policies", type=lambda s: s.split(","), default=list(POLICIES))
    f.add_argument("--cache-tokens", type=int, default=2_000_000)
    f.add_argument("--max-seqs", type=int, default=128)
    f.add_argument("--slo-ttft", type=float, default=1.0)
    f.add_argument("--slo-tpot", type=float, default=0.030)
    f.add_argument("--seed", type=int, default=1)
    g = sub.add_parser("generate")
    g.add_argument("--out", type=Path, required=True)
    g.add_argument("--sessions", type=int, default=400)
    g.add_argument("--rate", type=float, default=2.0)
    g.add_argument("--block", type=int, default=544)
    g.add_argument("--seed", type=int, default=1)
    r = sub.add_parser("replay")
    r.add_argument("trace", type=Path)
    r.add_argument("--fit", type=Path, default=GPU / FLEET_COST)
    r.add_argument("--prefillers", type=int, default=8)
    r.add_argument("--decoders", type=int, default=8)
    r.add_argument("--policy", default="ours", choices=list(POLICIES))
    r.add_argument("--block", type=int, default=0, help="the trace's hash block (0: the fitted engine's)")
    r.add_argument("--closed-loop", action="store_true")
    r.add_argument("--cache-tokens", type=int, default=2_000_000)
    r.add_argument("--slo-ttft", type=float, default=1.0)
    r.add_argument("--slo-tpot", type=float, default=0.030)
    a = ap.parse_args(argv)
    if a.cmd == "validate":
        validate(a.out)
    elif a.cmd == "fleet":
        fleet(a)
    elif a.cmd == "generate":
        dump(agentic(AgenticParams(sessions=a.sessions, rate_per_s=a.rate, block=a.block, seed=a.seed)), a.out)
    else:
        cost = fit(a.fit)
        if a.block:
            cost = replace(cost, block=a.block)
        reqs = load(a.trace)
        sim = Sim(cost, FleetConfig(a.prefillers, a.decoders, cache_tokens=a.cache_tokens), POLICIES[a.policy])
        if a.closed_loop:
            ClosedLoop(sim, reqs)
        else:
            for q in reqs:
                sim.submit(q, q.timestamp_ms / 1e3)
        sim.run()
        print(json.dumps(summarize(sim.results, a.slo_ttft, a.slo_tpot), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
