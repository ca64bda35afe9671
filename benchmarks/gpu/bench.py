"""One set-up of the GPU benchmark in one call: start its engines, probe, run the workloads.

    python3 -m benchmarks.gpu.bench --setup colocated|upstream|hybrid-pd-1p1d --model DIR --out DIR \
        [--prefill-gpu 0 --decode-gpu 1]          (deploy/gpu/bench_gpu.sh run SETUP KIND OUT runs it)

Set-ups (benchmarks/setups.py, here with GPU engines, each with the same memory share of its GPU; by default
all on GPU 0, with --prefill-gpu/--decode-gpu P and D on GPUs of their own and the colocated engine alone on
the decoder's):
- colocated: one engine, no connector.
- upstream: vLLM's NixlConnector on a prefiller and a decoder, driven by the flow of vLLM's toy proxy (P with
  max_tokens=1 and do_remote_decode, then D with P's kv_transfer_params), as vLLM's NixlConnector usage guide
  runs it (docs.vllm.ai/en/stable/features/nixl_connector_usage): connector NixlConnector, one side-channel port
  per worker (VLLM_NIXL_SIDE_CHANNEL_PORT), UCX as NIXL's backend. The guide's UCX_NET_DEVICES=all only widens
  the network devices (our launchers keep UCX on loopback for 127.0.0.1), and both connectors run under the same
  launcher environment. With P and D on one GPU without NVLink, UCX serves a READ over tcp/lo unless
  UCX_CUDA_IPC_ENABLE_GET_ZCOPY=on is exported (benchmarks/results/2026-11-23-h100-qwen3next/header.md, finding 1).
  `--upstream-flow proxy` puts our proxy in front instead (same engines).
- hybrid-pd-1p1d: our connector on both workers, our proxy in front.

Engines that share a GPU start one after the other (each profiles its memory alone). What one call does:
1. start the engines (the first start compiles the Triton kernels; later ones find them in the disk cache);
2. phase probe: a 3-turn conversation twice (cold, then warm: other tokens, similar lengths), each request alone,
   with every engine's and the proxy's /metrics read before and after it;
3. workloads (benchmarks/workloads.py) at each prompt length and concurrency, until --deadline-s; `trace`
   replays a Mooncake-format trace (benchmarks/trace_replay.py) closed loop at each concurrency and open loop
   at each --rate (rows of concurrency 0, workload trace@R/s);
4. --decode-alone N: N new prompts at once straight to the serving engine, the token gaps while all N decode
   and none prefills: the decoder's ITL with no prefill load, next to the workloads' ITL at that concurrency;
5. after the engines stop: a device-to-device copy of each transfer's byte count on the decoder's GPU and, when
   P has a GPU of its own, from P's GPU to D's.
Writes OUT/part-SETUP.json (every request, the probe's metric deltas, start times) and OUT/SETUP-logs.tar.gz.
benchmarks/gpu/merge.py turns the parts into results.json and summary.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import io
import json
import math
import os
import re
import shlex
import statistics
import sys
import tarfile
import time
import traceback
from pathlib import Path

from benchmarks.client import T0, log
from benchmarks.gpu.device_copy import device_copy
from benchmarks.gpu.probes import decode_alone, probe
from benchmarks.setups import Gpus, Setup
from benchmarks.trace_replay import SHAPES_HELP, closed_loop, replay_open, to_requests, trace_of
from benchmarks.workloads import Request, Tokens, agentic, insert_middle, oracle_hits, shared_system

LOGPROBS = 2  # top-2 log-probabilities per generated token: greedy equality up to near-ties (merge.py)
BLOCK_RE = re.compile(r"[Ss]etting attention block size to (\d+) tokens")
MAMBA_BLOCK_RE = re.compile(r"mamba_block_size[=: ]+(\d+)")


# ---- workloads ----------------------------------------------------------------------------------------------

def sessions_of(requests: list[Request]) -> list[list[Request]]:
    by: dict[str, list[Request]] = {}
    for r in requests:
        by.setdefault(r.session, []).append(r)
    return list(by.values())


WORKLOADS = ("agentic", "shared_system", "insert_middle")


def workload(kind: str, tokens: Tokens, length: int, conc: int, seed: int) -> list[Request]:
    """Requests whose prompts average about `length` tokens (workloads.py sizes them in units of its `block`)."""
    if kind == "agentic":  # prompts grow from ~1.95 to ~4.95 units over 5 turns: mean ~3.45 units
        return agentic(tokens, max(64, int(length / 3.45)), sessions=max(2, conc), turns=5, seed=seed)
    if kind == "shared_system":  # 2.5 units of system prompt + 0.5 of question
        return shared_system(tokens, max(64, length // 3), users=max(4, conc), seed=seed)
    if kind == "insert_middle":  # a 3-unit document, edited 3 times
        return insert_middle(tokens, max(64, length // 3), edits=3, seed=seed)
    raise SystemExit(f"unknown workload {kind!r}")


def run_requests(setup: Setup, requests: list[Request], conc: int, max_tokens: int, tag: dict,
                 rate: float = 0.0) -> dict:
    """Sessions in parallel (at most `conc` at once), each session's turns in order, a turn's `think_s` after the
    previous answer; with `rate`, open loop instead: each request sent when due (trace_replay.replay_open, rows
    with due_s and late_s). A request's own `max_tokens` (a trace's output length) wins over `max_tokens`."""
    errors: list[str] = []
    before = setup.transfer_counters()
    alone = conc == 1 and not rate  # per-request transfer counters only when nothing overlaps

    def send(req: Request) -> dict | None:
        body = {"model": "m", "prompt": list(req.token_ids), "max_tokens": req.max_tokens or max_tokens,
                "temperature": 0, "ignore_eos": True} | ({"logprobs": LOGPROBS} if LOGPROBS else {})
        sent = time.monotonic()
        c0 = setup.transfer_counters() if alone else None
        try:
            seen = setup.send(body)
        except Exception as e:
            errors.append(f"{req.session}/{req.turn}: {e!r}")
            return None
        c1 = setup.transfer_counters() if alone else None
        arr = seen["arrivals"]
        gaps = [b - a for a, b in zip(arr, arr[1:])]
        row = dict(tag, session=req.session, turn=req.turn, prompt_tokens=len(req.token_ids),
                   hit_tokens=seen["hit_tokens"], reported_cached=seen.get("reported_cached", seen["hit_tokens"]),
                   ttft_s=arr[0] if arr else None, e2e_s=seen["e2e_s"], p_s=seen["p_s"],
                   itl_s=statistics.median(gaps) if gaps else None, sent_s=sent - T0,
                   gaps_ms=[round(g * 1e3, 3) for g in gaps],
                   completion_tokens=(seen["usage"] or {}).get("completion_tokens", 0), text=seen["text"],
                   computed_on=((seen["usage"] or {}).get("hybrid_pd") or {}).get("computed_on"),
                   tokens=seen.get("tokens"), margins=seen.get("margins"))
        if c0 is not None and c1:
            row |= {k: c1[k] - c0[k] for k in c1}
        return row

    start = time.monotonic()
    rows = replay_open(requests, rate, send) if rate else closed_loop(requests, conc, send)
    wall = time.monotonic() - start
    after = setup.transfer_counters()
    return {"rows": rows, "wall_s": wall, "errors": errors,
            "transfer": {k: after[k] - before.get(k, 0.0) for k in after},
            "throughput_tok_s": sum(r["completion_tokens"] for r in rows) / wall if wall else 0.0,
            "placement_rates": setup.placement_rates()}  # what ours' model had learned by the cell's end


# ---- main ---------------------------------------------------------------------------------------------------

def engine_block(logs: Path) -> int:
    for path in sorted(logs.glob("*.log")):
        m = BLOCK_RE.search(path.read_text(errors="replace"))
        if m:
            return int(m.group(1))
    return 0


def pack_logs(logs: Path, out: Path) -> None:
    """Each log's interesting lines and its tail, in one small tar.gz."""
    keep = re.compile(r"block size|hybrid_pd|hybrid-pd|Nixl|NIXL|ERROR|Error|Traceback|WARNING|took|seconds|graph|"
                      r"compile|KV cache|Available|memory|healthy|skipped|decode-only|fallback|: load \d+ tokens|"
                      r"checkpoint|placement|pd timing|jit|autotun", re.I)
    with tarfile.open(out, "w:gz") as tar:
        for path in sorted(logs.glob("*.log")):
            lines = path.read_text(errors="replace").splitlines()
            # every turn's load, placement and PD timing line of a run (a slow turn is read from them afterwards)
            picked = [ln for ln in lines[:-200] if keep.search(ln)][-5000:] + ["---- tail ----"] + lines[-200:]
            data = ("\n".join(picked) + "\n").encode()[-1_500_000:]
            info = tarfile.TarInfo(path.name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def record(result: dict, run: dict, reqs: list[Request], block: int, tag: dict) -> None:
    """A run into the part, each row with its oracle hit, and its log line."""
    oracle = dict(zip(((r.session, r.turn) for r in reqs), oracle_hits(reqs, block or 1)))
    for row in run["rows"]:
        row["oracle_hit"] = oracle[(row["session"], row["turn"])]
    run |= tag
    result["runs"].append(run)
    ttfts = sorted(r["ttft_s"] for r in run["rows"] if r["ttft_s"] is not None)
    late = [r["late_s"] for r in run["rows"] if "late_s" in r]
    log(f"{tag['workload']} L={tag['length']} c={tag['concurrency']}: {len(run['rows'])} requests, "
        f"TTFT p50 {ttfts[len(ttfts) // 2] * 1e3 if ttfts else float('nan'):.1f} ms, "
        f"{run['throughput_tok_s']:.0f} tok/s, errors {len(run['errors'])}"
        + (f", sends late by at most {max(late) * 1e3:.1f} ms" if late else ""))


def write_part(path: Path, result: dict) -> None:
    path.write_text(json.dumps(result, indent=1))


def matrix(setup: Setup, tokens: Tokens, args: argparse.Namespace, block: int, result: dict, save, salt: int = 0
           ) -> None:
    """The workloads of the command line, each run recorded into `result` (saved after each); `salt`: other
    prompts of the same shapes (a proxy variant on engines that cached the first ones)."""
    kinds = args.workloads.split(",")
    for length in map(int, args.lengths.split(",")):
        for kind in (k for k in kinds if k != "trace"):
            for conc in map(int, args.concurrency.split(",")):
                if kind == "insert_middle" and conc > 1:
                    continue  # one document, edited in order
                # the same prompts whatever subset of the matrix a call runs (runs 2026-11-23 used a counter)
                seed = 1000 + 97 * WORKLOADS.index(kind) + length % 9973 + 31 * conc + 7919 * salt
                if time.monotonic() - T0 > args.deadline_s:
                    result["errors"].append(f"deadline: skipped {kind} {length} c={conc}")
                    continue
                reqs = workload(kind, tokens, length, conc, seed)
                tag = {"workload": kind, "length": length, "concurrency": conc}
                record(result, run_requests(setup, reqs, conc, args.max_tokens, tag), reqs, block, tag)
                save()
    if "trace" in kinds:
        trace = trace_of(args.trace, args.trace_block)
        modes = [(int(c), 0.0) for c in filter(None, args.concurrency.split(","))]
        modes += [(0, float(r)) for r in filter(None, args.rate.split(","))]
        for i, (conc, rate) in enumerate(modes):  # other tokens each time: no hit on an earlier replay
            reqs = to_requests(trace, tokens, args.trace_block, i + 100 * salt)
            length = round(statistics.fmean(len(r.token_ids) for r in reqs))  # the rows' `length`: mean prompt
            tag = {"workload": f"trace@{rate:g}/s" if rate else "trace", "length": length, "concurrency": conc}
            if time.monotonic() - T0 > args.deadline_s:
                result["errors"].append(f"deadline: skipped {tag}")
                continue
            record(result, run_requests(setup, reqs, conc, args.max_tokens, tag, rate), reqs, block, tag)
            save()


def run_variants(setup: Setup, tokens: Tokens, args: argparse.Namespace, block: int, result: dict, name: str
                 ) -> list[Path]:
    """Each of --proxy-variants after the set-up's own workloads: a fresh proxy with the variant's flags in front
    of the same engines, the same workloads with prompts of their own (salted: the engines cached the first
    ones), into part-NAME-<slug>.json (the peer's policy, or the variant's flags and values), a set-up of its
    own for merge.py."""
    parts = []
    for i, variant in enumerate(filter(None, args.proxy_variants.split(";")), 1):
        words = shlex.split(variant)  # a peer's policy is named by itself, anything else by its flags and values
        named = words[1:] if words[0] == "--pd-policy" else words
        slug = re.sub(r"[^a-z0-9]+", "-", " ".join(named).lower()).strip("-")
        parts.append(args.out / f"part-{name}-{slug}.json")
        vresult = dict(result, tag=f"{args.tag}-{slug}", runs=[], errors=[], probe=[],
                       args=dict(result["args"], proxy_args=f"{args.proxy_args} {variant}".strip()))
        setup.restart_proxy(tuple(words), f"proxy-{slug}")
        log(f"proxy variant {slug}: {variant}")
        # its own phase probe (before, the variants' parts carried the set-up's): where the set-up served the
        # probe on D alone, `--pd-policy always-remote`'s is where our PD tax shows (merge.py, pd_overhead_ms_c1)
        vresult["probe"] = probe(setup, tokens, args.probe_length, args.max_tokens, block, salt=i)
        matrix(setup, tokens, args, block, vresult, functools.partial(write_part, parts[-1], vresult), i)
    return parts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--setup", required=True, choices=["colocated", "upstream", "hybrid-pd-1p1d"])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tag", default="", help="suffix of the part's name (e.g. -v2)")
    Gpus.add_flags(ap)
    ap.add_argument("--lengths", default="2048,8192")
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--workloads", default="agentic,shared_system,insert_middle",
                    help="of agentic, shared_system, insert_middle, trace (--trace replayed closed loop at each "
                    "--concurrency, then open loop at each --rate; its requests ask for the trace's output lengths)")
    ap.add_argument("--trace", default="agentic-8k", help=SHAPES_HELP)
    ap.add_argument("--trace-block", type=int, default=512, help="tokens per hash id of --trace")
    ap.add_argument("--rate", default="", help="open-loop request rates (req/s, comma list) of the trace workload: "
                    "each request sent when due (the trace's timestamps scaled to the rate) whatever is in flight")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--upstream-flow", choices=["toy", "proxy"], default="toy")
    ap.add_argument("--vllm-args", default="", help="more vLLM flags for every engine, e.g. '--jit-monitor-verbose' "
                    "(vLLM >= 0.32: every kernel compiled while serving, not only each kernel's first)")
    ap.add_argument("--proxy-variants", default="", help="';'-separated proxy flags, each run after the set-up's "
                    "workloads on the same engines with a fresh proxy and prompts of their own (e.g. '--pd-policy "
                    "isl-bounding;--itl-slo-ms 60'): part-SETUP-<policy, or flags and values>.json each")
    ap.add_argument("--proxy-args", default="", help="more flags for our proxy, e.g. '--pd-policy always-remote'")
    ap.add_argument("--probe-length", type=int, default=8192)
    ap.add_argument("--warmup-lengths", default="",
                    help="untimed agentic conversations at these lengths after the probe, before the workloads")
    ap.add_argument("--logprobs", type=int, default=2, help="top-k logprobs per token (0: none; runs of "
                    "2026-11-23 had none)")
    ap.add_argument("--decode-alone", default="", help="concurrencies of the no-prefill-load ITL measurement "
                    "(at the first of --lengths, 4x --max-tokens each)")
    ap.add_argument("--deadline-s", type=float, default=540, help="start no workload after this")
    args = ap.parse_args(argv)
    global LOGPROBS
    LOGPROBS = args.logprobs
    args.out.mkdir(parents=True, exist_ok=True)
    name = args.setup + args.tag
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-logs-{name}"  # raw logs stay there; a digest comes back
    logs.mkdir(parents=True, exist_ok=True)
    part = args.out / f"part-{name}.json"
    result = {"setup": args.setup, "tag": args.tag, "args": {k: str(v) for k, v in vars(args).items()},
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "runs": [], "probe": [], "errors": []}

    save = functools.partial(write_part, part, result)

    gpus = dataclasses.replace(Gpus.from_args(args), vllm_extra=tuple(shlex.split(args.vllm_args)))
    setup = Setup(args.setup, gpus, logs, upstream_flow=args.upstream_flow,
                  proxy_args=tuple(shlex.split(args.proxy_args)))
    try:
        import importlib.metadata as md

        result["versions"] = {p: md.version(p) for p in ("vllm", "torch", "transformers", "nixl", "hybrid-pd")
                              if _has(md, p)}
        tokens = Tokens(args.model)
        setup.start()
        result["start_s"] = setup.workers.start_s
        block = engine_block(logs)
        result["block"] = block
        log(f"aligned block {block} tokens")
        save()
        result["probe"] = probe(setup, tokens, args.probe_length, args.max_tokens, block)
        if not block:  # no log line: every prefix hit is a whole number of aligned blocks
            hits = [p["hit_tokens"] for p in result["probe"] if p["hit_tokens"]]
            block = result["block"] = functools.reduce(math.gcd, hits, 0)
            log(f"aligned block from the probe's hits: {block}")
        save()
        for conc in map(int, args.decode_alone.split(",") if args.decode_alone else []):
            length = int(args.lengths.split(",")[0])
            alone = decode_alone(setup, tokens, length, conc, 4 * args.max_tokens)
            result.setdefault("decode_alone", []).append(alone)
            log(f"decode alone c={conc} L={length}: {alone}")
            save()
        for length in map(int, args.warmup_lengths.split(",") if args.warmup_lengths else []):
            warm = agentic(tokens, max(64, int(length / 3.45)), sessions=2, turns=3, seed=900 + length % 97)
            run_requests(setup, warm, 2, 8, {"workload": "warmup"})  # untimed: compiles this length's shapes
            log(f"warm-up at {length} tokens done")
        matrix(setup, tokens, args, block, result, save)
        run_variants(setup, tokens, args, block, result, name)
    except Exception:
        result["errors"].append(traceback.format_exc())
        log(traceback.format_exc())
    finally:
        setup.close()
        save()
    try:
        counts = [(int(r["bytes"]), int(r["descriptors"])) for run in result["runs"] for r in run["rows"]
                  if r.get("bytes")]
        counts += [(int(p["deltas"].get("decode", {}).get(k, 0)), 1) for p in result["probe"]
                   for k in ("vllm:hybrid_pd_bytes_transferred_sum", "vllm:nixl_bytes_transferred_sum")]
        result["device_copy"] = device_copy([c for c in counts if c[0] > 0], args.decode_gpu,
                                            None if args.setup == "colocated" else args.prefill_gpu)
    except Exception:
        result["errors"].append(traceback.format_exc())
    save()
    pack_logs(logs, args.out / f"{name}-logs.tar.gz")
    log(f"wrote {part}")
    return 0


def _has(md, name: str) -> bool:
    try:
        md.version(name)
        return True
    except md.PackageNotFoundError:
        return False


if __name__ == "__main__":
    sys.exit(main())
