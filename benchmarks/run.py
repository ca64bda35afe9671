"""Benchmark harness: the same workloads through every set-up, in one run, side by side.

    bash deploy/dev.sh bench [--setups colocated,upstream,hybrid-pd-1p1d,hybrid-pd-2p1d]
                             [--connector upstream|hybrid] [--out benchmarks/results/<date>-cpu-workloads]

Writes results.json (every request), summary.md (ratios against the colocated engine and upstream) and PNG
plots into --out. Requests go one at a time, so TTFT is not queueing; throughput is output tokens over the
set-up's whole wall time. Hit tokens are compared with an oracle that knows every computed boundary, bytes
with what the decoder's connector counted.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.naming import results_dir
from benchmarks.report import write_report
from benchmarks.setups import SETUPS, CpuBed, Setup, running
from benchmarks.workloads import Tokens, all_workloads, oracle_hits

BLOCK = 256  # the tiny model's aligned block on CPU (vLLM grows the attention block to the Mamba page)
MAX_TOKENS = 16


def measure(setup, requests, oracle) -> dict:
    before = last = setup.transfer_counters()
    rows, start = [], time.monotonic()
    for req, best in zip(requests, oracle):
        body = {"model": "tiny", "prompt": list(req.token_ids), "max_tokens": MAX_TOKENS, "temperature": 0,
                "ignore_eos": True}
        seen = setup.send(body)
        arrivals = seen["arrivals"]
        gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
        rows.append({"workload": req.workload, "session": req.session, "turn": req.turn,
                     "prompt_tokens": len(req.token_ids), "oracle_hit": best, "hit_tokens": seen["hit_tokens"],
                     "reported_cached": seen.get("reported_cached", seen["hit_tokens"]),
                     "ttft_s": arrivals[0] if arrivals else None, "e2e_s": seen["e2e_s"],
                     "itl_s": statistics.fmean(gaps) if gaps else None,
                     "completion_tokens": (seen["usage"] or {}).get("completion_tokens", 0)})
        now = setup.transfer_counters()
        rows[-1] |= {"bytes": now["bytes"] - last["bytes"], "descriptors": now["descriptors"] - last["descriptors"]}
        last = now
    wall = time.monotonic() - start
    after = last
    return {"requests": rows, "wall_s": wall, "transfer": {k: after[k] - before[k] for k in after},
            "throughput_tok_s": sum(r["completion_tokens"] for r in rows) / wall}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--setups", default=",".join(SETUPS))
    ap.add_argument("--connector", default="hybrid", choices=["upstream", "hybrid"],
                    help="KV connector of the hybrid-pd set-ups")
    ap.add_argument("--out", type=Path, default=results_dir("cpu", "workloads"))
    ap.add_argument("--worker-args", default="", help="extra `hybrid-pd prefill|decode` flags for every worker, "
                    "e.g. '--checkpoint-every 256' (a Mamba checkpoint at every block boundary)")
    args = ap.parse_args(argv)
    from hybrid_pd.prefill.dev.tiny_model import build_tiny_model

    model = str(build_tiny_model())
    bed = CpuBed(model, extra=tuple(shlex.split(args.worker_args)))
    requests = all_workloads(Tokens(model), BLOCK)
    oracle = oracle_hits(requests, BLOCK)
    logs = Path(tempfile.mkdtemp(prefix="hybrid-pd-bench-"))
    results = {"command": "bash deploy/dev.sh bench " + " ".join(argv if argv is not None else sys.argv[1:]),
               "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}, "
                          f"{_cores()} cores, Python {platform.python_version()}",
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "block": BLOCK,
               "max_tokens": MAX_TOKENS, "connector": args.connector, "worker_args": args.worker_args, "setups": {}}
    for name in args.setups.split(","):
        print(f"[bench] {name}: starting", flush=True)
        with running(Setup(name, bed, logs, args.connector)) as setup:
            results["setups"][name] = measure(setup, requests, oracle)
        r = results["setups"][name]
        print(f"[bench] {name}: {len(r['requests'])} requests in {r['wall_s']:.1f}s, "
              f"hits {sum(x['hit_tokens'] for x in r['requests'])}/{sum(oracle)} oracle tokens", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    write_report(results, args.out)
    print(f"[bench] wrote {args.out}/summary.md (logs: {logs})")
    return 0


def _cores() -> int:
    import os

    return len(os.sched_getaffinity(0))


if __name__ == "__main__":
    sys.exit(main())
