"""The prefiller alone: the same prompts on one prefill engine per set-up, to find where a prefill's time goes.

    python3 -m benchmarks.gpu.prefill_probe --setup SETUP --model DIR --out DIR [--burst 8] [--profile]

Each set-up is one prefill engine started by our launcher with the GPU benchmark's flags (setups.Gpus:
same memory share, CUDA graphs, warm-up), differing only in its connector: none (no PD), upstream (vLLM's
NixlConnector) and ours, with and without shipping checkpoints (HYBRID_PD_SHIP_CHECKPOINTS=0) or the KV integrity
digests (hybrid-nodigest: HYBRID_PD_KV_DIGESTS=0), or our engine given plain requests only (hybrid-plain: the
same engine and flags with the connector idle, so that what a burst of P legs costs beyond the engine's flags shows
apart). Every set-up gets the same requests in the same order, the
P leg of a PD turn (max_tokens=1, stream off, `do_remote_decode` where a connector runs; the same body without it
as a "plain" request on our engine and on none):
- cold prompts at 4,858 and 4,857 tokens (upstream's P computes all N prompt tokens, ours N-1), 2,048 and 8,192,
  several distinct prompts each: the first pays any kernel compile, the rest show the steady state;
- a turn that extends an earlier prompt (4,352 cached + 2,396 new), as a conversation's next turn.
Per request: the client's wall time and the engine's /metrics deltas (scheduled-to-first-token = prefill time,
queue time, engine steps, prompt and cached tokens). No decoder runs: the P leg's own cost is what differs.
With --burst N, then rounds of N cold prompts sent at once and their N extensions at once (the P legs c=N sends):
each request's wall time from its burst's start. Writes OUT/prefill-SETUP.json (--role decode:
OUT/prefill-SETUP-decode.json, a decoder engine given every request plain, as a turn D serves alone: whether our
connector slows a decoder's own prefill). With --profile, a last round (cold 4,858, cold 8,192, an aligned 4,352
and its extension to 6,748) runs under vLLM's torch profiler, and
OUT/profile-SETUP.json sums its trace: GPU kernel time against the engine step's wall time, the top kernels and
vLLM's own annotated regions; with --burst too, one round of bursts more runs under the profiler, summed apart in
OUT/profile-SETUP-burst.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import time
from pathlib import Path

from benchmarks.client import log, metric_deltas, post_json, scrape
from benchmarks.setups import Gpus, Workers

KV_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
             "remote_block_ids": None, "remote_host": None, "remote_port": None}
WATCH = {"vllm:request_prefill_time_seconds_sum": "prefill_ms", "vllm:request_queue_time_seconds_sum": "queue_ms",
         "vllm:iteration_tokens_total_count": "steps", "vllm:prompt_tokens_total": "prompt_tokens",
         "vllm:prefix_cache_hits_total": "cache_hit_tokens",
         "vllm:request_inference_time_seconds_sum": "inference_ms"}


def prompts(seed: int) -> list[tuple[str, list[int], bool]]:
    """(label, token ids, P leg?) in the order sent; the same for every set-up."""
    rng = random.Random(seed)

    def fresh(n: int) -> list[int]:
        return [rng.randrange(10, 1000) for _ in range(n)]

    out: list[tuple[str, list[int], bool]] = []
    for n, reps in ((4858, 4), (4857, 3), (2048, 3), (8192, 3)):
        out += [(f"cold {n} #{i}", fresh(n), True) for i in range(reps)]
    out += [(f"plain cold 4858 #{i}", fresh(4858), False) for i in range(3)]
    for i in range(3):
        base = fresh(4352)
        out += [(f"base 4352 #{i}", base, True), (f"extend 4352+2396 #{i}", base + fresh(2396), True)]
    return out


def post_raw(url: str) -> None:
    import urllib.request

    urllib.request.urlopen(urllib.request.Request(url, data=b"", method="POST"), timeout=120).read()


def summarize_traces(folder: Path, skip: frozenset[Path] = frozenset()) -> dict:
    """Sum the torch profiler traces in `folder` (not those in `skip`): kernel time on the GPU, annotated regions
    (vLLM's own), CPU ops and CUDA runtime calls (a host waiting on the device shows as cudaStreamSynchronize,
    cudaEventSynchronize or a synchronous cudaMemcpy)."""
    import collections
    import gzip

    out: dict = {}
    for f in sorted(set(folder.rglob("*.json*")) - skip):
        opener = gzip.open if f.suffix == ".gz" else open
        try:
            with opener(f, "rt") as fh:
                events = json.load(fh).get("traceEvents", [])
        except (OSError, ValueError) as e:
            out[f.name] = {"error": repr(e)}
            continue
        by_cat: dict = collections.defaultdict(lambda: collections.Counter())
        counts: dict = collections.defaultdict(collections.Counter)
        for e in events:
            if e.get("ph") != "X" or "dur" not in e:
                continue
            cat, name = e.get("cat", ""), e.get("name", "")[:90]
            by_cat[cat][name] += e["dur"] / 1e3
            counts[cat][name] += 1
        out[f.name] = {
            "total_ms_by_category": {c: round(sum(v.values()), 2) for c, v in by_cat.items()},
            "top": {c: [(n, round(ms, 2), counts[c][n]) for n, ms in v.most_common(25)]
                    for c, v in by_cat.items() if c in ("kernel", "user_annotation", "gpu_user_annotation",
                                                        "cpu_op", "cuda_runtime", "gpu_memcpy")},
        }
    return out


BURST_ROUNDS = 3


def leg_body(ids: list[int], p_leg: bool) -> dict:
    """One token after `ids`; a P leg (`do_remote_decode`) where `p_leg`, else a plain request."""
    body = {"model": "m", "prompt": ids, "max_tokens": 1, "stream": False, "temperature": 0}
    if p_leg:
        body["kv_transfer_params"] = KV_PARAMS
    return body


def send_leg(url: str, ids: list[int], p_leg: bool, t0: float) -> float:
    """One request of a burst: ms from the burst's start `t0` to its answer."""
    post_json(url + "/v1/completions", leg_body(ids, p_leg))
    return round((time.monotonic() - t0) * 1e3, 2)


def bursts(url: str, n: int, seed: int, p_leg: bool, first: tuple[int, int] = (4400, 5300),
           more: tuple[int, int] = (2000, 2800), vocab: int = 1000, rounds: int = 0) -> list[dict]:
    """`rounds` (default BURST_ROUNDS) rounds of `n` cold prompts (`first`: 4,400-5,300 tokens, as the agentic
    workload's first turns) sent at once, then their `n` extensions (`more`: +2,000-2,800 tokens) at once: per
    request its wall time from the burst's start, per burst the engine's /metrics deltas. Where a P leg's
    requests end together (a batch finishes at its last step) and how late, against upstream's P on the same
    burst, is what c=N's remote turns wait for. Token ids below `vocab`."""
    from concurrent.futures import ThreadPoolExecutor

    rng = random.Random(seed + 2)
    rows: list[dict] = []
    with ThreadPoolExecutor(max(n, 1)) as pool:
        for r in range((rounds or BURST_ROUNDS) if n else 0):
            firsts = [[rng.randrange(10, vocab) for _ in range(rng.randrange(*first))] for _ in range(n)]
            nexts = [ids + [rng.randrange(10, vocab) for _ in range(rng.randrange(*more))] for ids in firsts]
            for kind, batch in (("cold", firsts), ("extend", nexts)):
                before = {"p": scrape(url)}
                t0 = time.monotonic()
                walls = list(pool.map(lambda ids, t0=t0: send_leg(url, ids, p_leg, t0), batch))
                moved = metric_deltas(before, {"p": scrape(url)})["p"]
                rows.append({"label": f"burst {r} {kind} x{n}", "tokens": [len(ids) for ids in batch],
                             "p_leg": p_leg, "burst": True, "wall_ms": sorted(walls),
                             **{field: round(moved.get(m, 0.0) * 1e3, 2) if field.endswith("_ms")
                                else moved.get(m, 0.0) for m, field in WATCH.items()}})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--setup", required=True,
                    choices=["none", "upstream", "hybrid", "hybrid-noship", "hybrid-full", "hybrid-nodigest",
                             "hybrid-plain"])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=7)
    Gpus.add_flags(ap)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--burst", type=int, default=0,
                    help="N: then BURST_ROUNDS bursts of N cold prompts sent at once, each followed by a burst of "
                         "their extensions (a conversation's next turn), as c=N sends them")
    ap.add_argument("--role", choices=["prefill", "decode"], default="prefill",
                    help="decode: a decoder engine, every request plain (what a turn D serves alone computes)")
    args = ap.parse_args()
    name = args.setup if args.role == "prefill" else f"{args.setup}-decode"
    args.out.mkdir(parents=True, exist_ok=True)
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / f"prefill-logs-{name}"
    logs.mkdir(parents=True, exist_ok=True)
    prof_dir = Path(f"/tmp/prefill-prof-{name}")
    env = {}
    if args.setup == "hybrid-noship":
        env["HYBRID_PD_SHIP_CHECKPOINTS"] = "0"
    if args.setup == "hybrid-nodigest":  # P digests nothing (the KV integrity digests off)
        env["HYBRID_PD_KV_DIGESTS"] = "0"
    if args.setup == "hybrid-full":  # P computes N-1 tokens (before P stopped at the last boundary below N)
        env["HYBRID_PD_PREFILL_TO_BOUNDARY"] = "0"
    machine = Gpus.from_args(args, env)
    if args.profile:  # vLLM's torch profiler (GPU kernels and CPU ops), on for the last round only
        conf = {"profiler": "torch", "torch_profiler_dir": str(prof_dir), "torch_profiler_with_stack": False}
        machine = dataclasses.replace(machine, vllm_extra=("--profiler-config", json.dumps(conf)))
    engines = Workers(machine, logs)
    connector = {"none": "none", "upstream": "upstream"}.get(args.setup, "hybrid")
    legs = connector != "none" and args.role == "prefill" and args.setup != "hybrid-plain"  # P legs, or plain
    result: dict = {"setup": args.setup, "args": {k: str(v) for k, v in vars(args).items()}, "rows": [],
                    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    part = args.out / f"prefill-{name}.json"
    try:
        p = engines.ready(engines.start(args.role, args.role, connector))
        result["start_s"] = engines.start_s
        for label, ids, p_leg in prompts(args.seed):
            body = leg_body(ids, p_leg and legs)
            before = {"p": scrape(p.url)}
            t0 = time.monotonic()
            resp = post_json(p.url + "/v1/completions", body)
            wall = time.monotonic() - t0
            moved = metric_deltas(before, {"p": scrape(p.url)})["p"]
            row = {"label": label, "tokens": len(ids), "p_leg": p_leg, "wall_ms": round(wall * 1e3, 2),
                   "cached": ((resp.get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens")}
            for metric, field in WATCH.items():  # not `name`: the profile's file is named by it below
                v = moved.get(metric, 0.0)
                row[field] = round(v * 1e3, 2) if field.endswith("_ms") else v
            result["rows"].append(row)
            log(json.dumps(row))
            part.write_text(json.dumps(result, indent=1))
        for row in bursts(p.url, args.burst, args.seed, legs):
            result["rows"].append(row)
            log(json.dumps(row))
            part.write_text(json.dumps(result, indent=1))
        if args.profile:
            rng = random.Random(args.seed + 1)
            post_raw(p.url + "/start_profile")
            base = [rng.randrange(10, 1000) for _ in range(4352)]
            for ids in ([rng.randrange(10, 1000) for _ in range(4858)], [rng.randrange(10, 1000) for _ in range(8192)],
                        base, base + [rng.randrange(10, 1000) for _ in range(2396)]):  # the last extends the third
                post_json(p.url + "/v1/completions", leg_body(ids, legs))
            post_raw(p.url + "/stop_profile")
            time.sleep(5)
            (args.out / f"profile-{name}.json").write_text(json.dumps(summarize_traces(prof_dir), indent=1))
            if args.burst:  # then one round of bursts under the profiler, in a trace of its own
                seen = frozenset(prof_dir.rglob("*.json*"))
                post_raw(p.url + "/start_profile")
                rows = bursts(p.url, args.burst, args.seed + 10, legs,
                              rounds=1)
                post_raw(p.url + "/stop_profile")
                time.sleep(5)
                result["rows"] += [{**row, "label": f"profiled {row['label']}"} for row in rows]
                (args.out / f"profile-{name}-burst.json").write_text(
                    json.dumps(summarize_traces(prof_dir, seen), indent=1))
    except Exception as e:  # keep what was measured
        result["error"] = repr(e)
        log(f"error: {e!r}")
    finally:
        engines.close()
        part.write_text(json.dumps(result, indent=1))
    return 0 if "error" not in result else 1


if __name__ == "__main__":
    raise SystemExit(main())
