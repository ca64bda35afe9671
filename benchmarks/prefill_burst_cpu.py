"""Do our prefiller's calls end later than upstream's when several P legs arrive at once (as c=N sends them)? The
CPU bed's analogue of `benchmarks/gpu/prefill_probe.py --burst N`: one `hybrid-pd prefill` launcher at a time on
core 0 with the tiny model, upstream's connector, ours computing N-1 tokens (HYBRID_PD_PREFILL_TO_BOUNDARY=0, what
P does on a GPU) and ours as the CPU bed runs it (stopping at the last aligned boundary), then upstream's again (a
drift check). Each gets the same bursts (prefill_probe.bursts: N cold prompts at once, then their N extensions at
once, BURST_ROUNDS times), every request a P leg (`do_remote_decode`; no decoder reads them). Per burst, each
request's wall time from the burst's start; per set-up, the sum over bursts of the last request's time, and its
ratio to upstream's (the first run).

    python3 -m benchmarks.prefill_burst_cpu --out DIR [--burst 4] [--first 900,1100] [--more 400,600]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from benchmarks.client import log
from benchmarks.gpu.prefill_probe import bursts
from benchmarks.setups import CpuBed, Workers

SETUPS = {  # name: (connector, launcher environment)
    "upstream": ("upstream", {}),
    "ours-n-1": ("hybrid", {"HYBRID_PD_PREFILL_TO_BOUNDARY": "0"}),
    "ours": ("hybrid", {}),
}
ORDER = ("upstream", "ours-n-1", "ours", "upstream")


def span(text: str) -> tuple[int, int]:
    lo, hi = (int(x) for x in text.split(","))
    return lo, hi


def run_setup(model: str, name: str, args: argparse.Namespace) -> list[dict]:
    connector, env = SETUPS[name]
    logs = Path(tempfile.mkdtemp(prefix=f"burst-{name}-"))
    workers = Workers(CpuBed(model=model, served_name="m", env=env), logs)
    try:
        p = workers.ready(workers.start("prefill", "prefill", connector))
        return bursts(p.url, args.burst, args.seed, True, span(args.first), span(args.more), vocab=500)
    finally:
        workers.close()


def main() -> int:
    from hybrid_pd.prefill.dev.tiny_model import TinyModelSpec, build_tiny_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--burst", type=int, default=4)
    ap.add_argument("--first", default="900,1100", help="a cold prompt's tokens, lo,hi")
    ap.add_argument("--more", default="400,600", help="what an extension adds, lo,hi")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = str(build_tiny_model(TinyModelSpec()))
    runs: list[dict] = []
    for name in ORDER:
        rows = run_setup(model, name, args)
        last = [max(r["wall_ms"]) for r in rows]
        runs.append({"setup": name, "rows": rows, "sum_of_last_ms": round(sum(last), 1)})
        log(f"{name}: last request per burst {last} ms, sum {sum(last):.1f}")
    base = runs[0]["sum_of_last_ms"]
    result = {"args": {k: str(v) for k, v in vars(args).items()}, "date": time.strftime("%Y-%m-%d %H:%M UTC"),
              "runs": runs, "ratio_to_upstream": {r["setup"] + f"#{i}": round(r["sum_of_last_ms"] / base, 3)
                                                  for i, r in enumerate(runs)}}
    (args.out / "results.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result["ratio_to_upstream"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
