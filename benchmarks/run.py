"""Benchmark harness: the same workloads through every set-up, in one run, side by side.

    bash deploy/dev.sh bench [--setups colocated,upstream,hybrid-pd-1p1d,hybrid-pd-2p1d]
                             [--connector upstream|hybrid] [--out benchmarks/results/<date>-cpu-workloads]

`--workloads trace [--trace FILE|SHAPE] [--concurrency 2] [--rate 0.5]` replays a Mooncake-format trace instead
(benchmarks/trace_replay.py): closed loop at each concurrency, open loop at each rate.

Writes results.json (every request), summary.md (ratios against the colocated engine and upstream) and PNG
plots into --out. benchmarks/workloads.py's requests go one at a time, so TTFT is not queueing; throughput is
output tokens over the set-up's whole wall time. Hit tokens are compared with an oracle that knows every
computed boundary, bytes with what the decoder's connector counted.
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
from benchmarks.trace_replay import SHAPES_HELP, closed_loop, replay_open, to_requests, trace_of
from benchmarks.workloads import Tokens, all_workloads, oracle_hits

BLOCK = 256  # the tiny model's aligned block on CPU (vLLM grows the attention block to the Mamba page)
MAX_TOKENS = 16


def measure(setup, requests, oracle) -> dict:
    before = last = setup.transfer_counters()
    rows, start = [], time.monotonic()
    for req, best in zip(requests, oracle):
        rows.append(row_of(req, best, setup.send(body_of(req))))
        now = setup.transfer_counters()
        rows[-1] |= {"bytes": now["bytes"] - last["bytes"], "descriptors": now["descriptors"] - last["descriptors"]}
        last = now
    return totals(rows, time.monotonic() - start, before, last)


def measure_trace(setup, requests, oracle, conc: int, rate: float) -> dict:
    """The trace closed loop at `conc`, or open loop at `rate` requests/s (benchmarks/trace_replay.py)."""
    best = {(r.session, r.turn): b for r, b in zip(requests, oracle)}
    before, start = setup.transfer_counters(), time.monotonic()

    def send(req):
        return row_of(req, best[(req.session, req.turn)], setup.send(body_of(req)))

    rows = replay_open(requests, rate, send) if rate else closed_loop(requests, conc, send)
    return totals(rows, time.monotonic() - start, before, setup.transfer_counters())


def body_of(req) -> dict:
    return {"model": "tiny", "prompt": list(req.token_ids), "max_tokens": req.max_tokens or MAX_TOKENS,
            "temperature": 0, "ignore_eos": True}


def row_of(req, best: int, seen: dict) -> dict:
    arrivals = seen["arrivals"]
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    return {"workload": req.workload, "session": req.session, "turn": req.turn,
            "prompt_tokens": len(req.token_ids), "oracle_hit": best, "hit_tokens": seen["hit_tokens"],
            "reported_cached": seen.get("reported_cached", seen["hit_tokens"]),
            "ttft_s": arrivals[0] if arrivals else None, "e2e_s": seen["e2e_s"],
            "itl_s": statistics.fmean(gaps) if gaps else None,
            "completion_tokens": (seen["usage"] or {}).get("completion_tokens", 0)}


def totals(rows: list[dict], wall: float, before: dict, after: dict) -> dict:
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
    ap.add_argument("--workloads", default="all", choices=["all", "trace"],
                    help="all: benchmarks/workloads.py's, one request at a time; trace: --trace closed loop at each "
                    "--concurrency, then open loop at each --rate (its requests ask for the trace's output lengths)")
    ap.add_argument("--trace", default="cpu-tiny", help=SHAPES_HELP)
    ap.add_argument("--trace-block", type=int, default=512, help="tokens per hash id of --trace")
    ap.add_argument("--concurrency", default="1", help="closed-loop sessions at once (comma list; trace only)")
    ap.add_argument("--rate", default="", help="open-loop request rates (req/s, comma list; trace only): each "
                    "request sent when due (the trace's timestamps scaled to the rate) whatever is in flight")
    args = ap.parse_args(argv)
    from hybrid_pd.prefill.dev.tiny_model import build_tiny_model

    model = str(build_tiny_model())
    bed = CpuBed(model, extra=tuple(shlex.split(args.worker_args)))
    tokens = Tokens(model)
    if args.workloads == "trace":
        requests = to_requests(trace_of(args.trace, args.trace_block), tokens, args.trace_block)
    else:
        requests = all_workloads(tokens, BLOCK)
    modes = [(int(c), 0.0) for c in filter(None, args.concurrency.split(","))] if args.workloads == "trace" else []
    modes += [(0, float(r)) for r in filter(None, args.rate.split(","))] if args.workloads == "trace" else []
    oracle = oracle_hits(requests, BLOCK)
    logs = Path(tempfile.mkdtemp(prefix="hybrid-pd-bench-"))
    results = {"command": "bash deploy/dev.sh bench " + " ".join(argv if argv is not None else sys.argv[1:]),
               "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}, "
                          f"{_cores()} cores, Python {platform.python_version()}",
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "block": BLOCK,
               "max_tokens": MAX_TOKENS if args.workloads == "all" else "the trace's",
               "mode": "one request at a time" if args.workloads == "all" else f"trace {args.trace} replayed",
               "connector": args.connector, "worker_args": args.worker_args, "setups": {}}
    for name in args.setups.split(","):
        print(f"[bench] {name}: starting", flush=True)
        if not modes:
            with running(Setup(name, bed, logs, args.connector)) as setup:
                results["setups"][name] = measure(setup, requests, oracle)
        for conc, rate in modes:  # fresh engines for each: every replay starts from empty caches, as the oracle
            key = f"{name} {rate:g}/s" if rate else f"{name} c={conc}"
            own = logs / key.replace(" ", "-").replace("/", "")  # logs and ready files of their own
            own.mkdir()
            with running(Setup(name, bed, own, args.connector)) as setup:
                results["setups"][key] = measure_trace(setup, requests, oracle, conc, rate)
        for key in [k for k in results["setups"] if k.split(" ")[0] == name]:
            r = results["setups"][key]
            late = [x["late_s"] for x in r["requests"] if "late_s" in x]
            print(f"[bench] {key}: {len(r['requests'])} requests in {r['wall_s']:.1f}s, "
                  f"hits {sum(x['hit_tokens'] for x in r['requests'])}/{sum(oracle)} oracle tokens"
                  + (f", sends late by at most {max(late) * 1e3:.1f} ms" if late else ""), flush=True)
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
