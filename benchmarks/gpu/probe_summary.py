"""The prefill probe's set-ups against upstream's, from its parts (prefill_probe.py) under FOLDER/probe: writes
FOLDER/results.json and prints it.

    python3 benchmarks/gpu/probe_summary.py FOLDER

ratios: per set-up of ours, the paired median of its P prefill (scheduled-to-first-token) over upstream's on the
same prompts (phases.prefill_vs_upstream: P legs, the first prompt of each kind left out). Per set-up besides:
under bursts, its last and its mean answer over upstream's, burst by burst, and its summed prefill time over
upstream's; alone, its P leg's wall time over upstream's (median), and the wall time beyond the engine's own
prefill (HTTP, the answer's kv_transfer_params) in ms.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

try:
    from .phases import prefill_vs_upstream
except ImportError:  # run as a script
    from phases import prefill_vs_upstream  # type: ignore[no-redef]


def single_legs(rows: list[dict]) -> list[dict]:
    return [r for r in rows if not r.get("burst") and r["p_leg"] and not r["label"].endswith("#0")]


def summarize(folder: Path) -> dict:
    parts = {f.stem.removeprefix("prefill-"): f for f in (folder / "probe").glob("prefill-*.json")}
    rows = {s: json.loads(f.read_text())["rows"] for s, f in parts.items()}
    up = {r["label"]: r for r in rows.pop("upstream")}
    out: dict = {"ratios": {}, "setups": {}}
    alone = [r["wall_ms"] - r["prefill_ms"] for r in single_legs(list(up.values()))]
    out["upstream_leg_wall_beyond_prefill_ms_median"] = round(statistics.median(alone), 2)
    for setup, its in sorted(rows.items()):
        out["ratios"][f"prefill_vs_upstream_prefill_{setup}"] = prefill_vs_upstream(folder, setup)
        bursts = [r for r in its if r.get("burst") and not r["label"].startswith("profiled") and r["label"] in up]
        legs = [r for r in single_legs(its) if r["label"] in up]
        out["setups"][setup] = {
            "burst_last_answer_vs_upstream": [
                round(r["wall_ms"][-1] / up[r["label"]]["wall_ms"][-1], 3) for r in bursts
            ],
            "burst_mean_answer_vs_upstream": [
                round(sum(r["wall_ms"]) / sum(up[r["label"]]["wall_ms"]), 3) for r in bursts
            ],
            "burst_summed_prefill_vs_upstream": round(
                sum(r["prefill_ms"] for r in bursts) / sum(up[r["label"]]["prefill_ms"] for r in bursts), 3
            )
            if bursts
            else None,
            "leg_wall_vs_upstream_median": round(
                statistics.median(r["wall_ms"] / up[r["label"]]["wall_ms"] for r in legs), 3
            ),
            "leg_wall_beyond_prefill_ms_median": round(
                statistics.median(r["wall_ms"] - r["prefill_ms"] for r in legs), 2
            ),
        }
    if "prefill_vs_upstream_prefill_hybrid" in out["ratios"]:  # the name the GPU benchmark's results.json uses
        out["ratios"]["prefill_vs_upstream_prefill"] = out["ratios"]["prefill_vs_upstream_prefill_hybrid"]
    return out


def main(argv: list[str] | None = None) -> int:
    folder = Path((argv or sys.argv[1:])[0])
    out = summarize(folder)
    (folder / "results.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
