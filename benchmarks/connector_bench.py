"""Connector benchmark: our connector vs vLLM's NixlConnector, same engines, same conversation, one run.

    bash deploy/dev.sh run python -m benchmarks.connector_bench [--turns 6] [--out DIR]   (DIR: a dated folder)

A conversation of growing history (turn k+1 = turn k + its greedy answer + new words, as token ids fixed by a
colocated engine) goes through prefill (P) + decode (D) with each connector in turn, on fresh engines. Per
turn: P prefills (max_tokens=1, do_remote_decode), D streams the answer with P's kv_transfer_params. Measured
per turn, from D's own metrics and the client:
- bytes moved and their ratio to the minimal bytes (attention blocks D lacks + one state per GDN layer: the
  floor, which upstream moves), NIXL descriptors, transfer seconds -> GB/s, next to a memcpy of the same bytes
  in one process (numpy, best of 20);
- D-side TTFT (first streamed token of D's request) and end-to-end (P + D);
- D-local cached tokens on the next turn: a branch of turn k+1 (turn k + answer + other words) sent straight
  to D, no prefiller; the colocated engine's figure for the same sequence of requests is the bar;
- greedy output equal to the colocated engine's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.client import metric_sum, scrape_metrics
from benchmarks.naming import results_dir
from benchmarks.setups import CpuBed, Workers
from hybrid_pd.connector.config import ConnectorConfig
from hybrid_pd.prefill.dev.demo_workload import stream, transfer_counters
from tests.support.conversation import ANSWER_TOKENS, cached, colocated_pass, complete
from tests.support.tiny_layout import BS, minimal_bytes


def memcpy_gbps(nbytes: int, reps: int = 20) -> float:
    src, dst = np.ones(nbytes, np.uint8), np.empty(nbytes, np.uint8)
    best = min(_timed(np.copyto, dst, src) for _ in range(reps))
    return nbytes / best / 1e9


def _nixl_owner(q_meta, q_stop, nbytes: int) -> None:
    """Child process: a NIXL agent owning `nbytes` of DRAM, alive until told to stop."""
    from hybrid_pd.connector.transport import NixlTransport

    buf = np.ones(nbytes, np.uint8)
    agent = NixlTransport("bench-owner", delay_us=ConnectorConfig().nixl_delay_us)
    agent.register([(buf.ctypes.data, nbytes)])
    q_meta.put((agent.metadata(), buf.ctypes.data))
    q_stop.get(timeout=600)
    agent.close()


def raw_read_gbps(sizes: list[int], reps: int = 20) -> dict[int, float]:
    """GB/s of one NIXL READ of each size between two processes on this host, outside any engine (same agent
    set-up as the connector's: UCX, progress-thread delay): what the wire allows, without engine steps."""
    import multiprocessing as mp

    from hybrid_pd.connector.transport import Desc, NixlTransport

    ctx = mp.get_context("spawn")
    q_meta, q_stop = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=_nixl_owner, args=(q_meta, q_stop, max(sizes)), daemon=True)
    child.start()
    agent = None
    try:
        meta, remote = q_meta.get(timeout=60)
        dst = np.zeros(max(sizes), np.uint8)
        agent = NixlTransport("bench-reader", delay_us=ConnectorConfig().nixl_delay_us)
        agent.register([(dst.ctypes.data, dst.nbytes)])
        peer, out = agent.add_peer(meta), {}
        for size in sizes:
            best = float("inf")
            for _ in range(reps):
                t = time.perf_counter()
                handle = agent.read(peer, [Desc(dst.ctypes.data, remote, size)])
                while not agent.poll(handle):
                    pass
                best = min(best, time.perf_counter() - t)
                agent.release(handle)
            out[size] = size / best / 1e9
        return out
    finally:
        if agent is not None:
            agent.close()
        q_stop.put(True)
        child.join(10)
        if child.is_alive():
            child.kill()


def _timed(fn, *args) -> float:
    t = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t


def engines(model: str, logs: Path, name: str) -> Workers:
    """Workers added by .start(), stopped by PID on close(); log files named after `name`."""
    return Workers(CpuBed(model), logs, prefix=f"{name}-")


def d_counters(url: str) -> dict[str, float]:
    return transfer_counters(url) | {"hits": metric_sum(scrape_metrics(url), "vllm:prefix_cache_hits_total")}


def pd_pass(p: str, d: str, conv: dict) -> list[dict]:
    rows = []
    for k, prompt in enumerate(conv["prompts"]):
        t0 = time.monotonic()
        p_resp = complete(p, prompt, 1, kv_transfer_params={"do_remote_decode": True})
        params = p_resp["kv_transfer_params"]
        before = d_counters(d)
        t1 = time.monotonic()
        text, _, ttft, _ = stream(d, "/v1/completions", {
            "model": "tiny", "prompt": prompt, "max_tokens": ANSWER_TOKENS, "temperature": 0.0, "ignore_eos": True,
            "kv_transfer_params": params})
        e2e = time.monotonic() - t0
        m = {key: v - before[key] for key, v in d_counters(d).items()}
        n = params.get("remote_num_tokens") or len(prompt) - 1
        local_hit = int(m["hits"])
        floor = minimal_bytes(n, local_hit)
        row = {"turn": k + 1, "prompt_tokens": len(prompt), "tokens_on_p": n, "d_local_hit": local_hit,
               "bytes": int(m["bytes"]), "minimal_bytes": floor, "bytes_over_minimal": m["bytes"] / floor,
               "descriptors": int(m["descriptors"]), "transfers": int(m["transfers"]),
               "failed": int(m["failed_transfers"]), "transfer_s": m["transfer_seconds"],
               "d_ttft_s": ttft, "e2e_s": e2e, "d_request_s": time.monotonic() - t1,
               "equal_to_colocated": text == conv["texts"][k], "text": text, "colocated_text": conv["texts"][k],
               "cached_next_turn_on_d": cached(complete(d, conv["branches"][k], ANSWER_TOKENS, logprobs=2)),
               "colocated_cached_next_turn": conv["cached_next"][k]}
        row["gbps"] = row["bytes"] / row["transfer_s"] / 1e9 if row["transfer_s"] > 0 else None
        row["memcpy_gbps"] = memcpy_gbps(row["bytes"]) if row["bytes"] else None
        rows.append(row)
    return rows


def summarize(results: dict) -> str:
    conns = list(results["connectors"])
    out = [f"# Connector benchmark: {' vs '.join(conns)}", "",
           f"Command: `{results['command']}`  ", f"Machine: {results['machine']}  ",
           f"Date: {results['date']}; tiny hybrid model (2 attention + 2 GDN layers), aligned block {BS} tokens, "
           f"{results['turns']}-turn conversation, {ANSWER_TOKENS} output tokens per turn, fresh P + D engines "
           "per connector.", "",
           "| connector | bytes / minimal (sum) | descriptors / request | GB/s in the engine (median) | raw NIXL READ "
           "GB/s | memcpy GB/s | D TTFT p50 ms | e2e p50 ms | equal to one engine | failed |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for c in conns:
        rows = results["connectors"][c]
        gbps = [r["gbps"] for r in rows if r["gbps"]]
        mem = [r["memcpy_gbps"] for r in rows if r["memcpy_gbps"]]
        raw = [r["raw_read_gbps"] for r in rows if r.get("raw_read_gbps")]
        out.append(f"| {c} | {sum(r['bytes'] for r in rows) / sum(r['minimal_bytes'] for r in rows):.2f} | "
                   f"{statistics.fmean(r['descriptors'] for r in rows):.1f} | "
                   f"{statistics.median(gbps) if gbps else 0:.3f} | {statistics.median(raw) if raw else 0:.2f} | "
                   f"{statistics.median(mem) if mem else 0:.2f} | "
                   f"{statistics.median(r['d_ttft_s'] for r in rows) * 1e3:.0f} | "
                   f"{statistics.median(r['e2e_s'] for r in rows) * 1e3:.0f} | "
                   f"{sum(r['equal_to_colocated'] for r in rows)}/{len(rows)} | {sum(r['failed'] for r in rows)} |")
    out += ["", "GB/s in the engine = bytes / the decoder connector's transfer time (READ posted -> completion seen "
            "by the engine, whose steps poll it); raw NIXL READ = the same byte counts read once between two "
            "processes outside any engine, best of 20; memcpy = numpy copy in one process, best of 20. The two "
            "in-engine figures are not one measure: upstream records NIXL's own telemetry (xferDuration, post to "
            "completion inside NIXL), ours the time until the engine sees the READ complete; both move the "
            "same bytes at the raw rate, and D's TTFT is the figure a user sees."]
    out += ["", "Per turn (bytes / minimal, descriptors, D's own hit, D-side TTFT ms):", "",
            "| turn | tokens | " + " | ".join(f"{c} bytes/min | {c} desc | {c} D hit | {c} TTFT" for c in conns)
            + " |", "|---|---|" + "---|" * 4 * len(conns)]
    for i, r0 in enumerate(results["connectors"][conns[0]]):
        cells = []
        for c in conns:
            r = results["connectors"][c][i]
            cells += [f"{r['bytes']:,} / {r['minimal_bytes']:,} ({r['bytes_over_minimal']:.2f})", str(r["descriptors"]),
                      str(r["d_local_hit"]), f"{r['d_ttft_s'] * 1e3:.0f}"]
        out.append(f"| {r0['turn']} | {r0['prompt_tokens']} | " + " | ".join(cells) + " |")
    out += ["", "Next turn sent straight to D after turn k went through PD (cached tokens; the colocated engine "
            "served the same sequence of requests alone):", "",
            "| k | colocated | " + " | ".join(conns) + " |", "|---|---|" + "---|" * len(conns)]
    for i, r0 in enumerate(results["connectors"][conns[0]]):
        out.append(f"| {r0['turn']} | {r0['colocated_cached_next_turn']} | "
                   + " | ".join(str(results["connectors"][c][i]["cached_next_turn_on_d"]) for c in conns) + " |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--connectors", default="upstream,hybrid")
    ap.add_argument("--out", type=Path, default=results_dir("cpu", "connector"))
    args = ap.parse_args(argv)
    from hybrid_pd.prefill.dev.tiny_model import build_tiny_model

    model = str(build_tiny_model())
    logs = Path(tempfile.mkdtemp(prefix="hybrid-pd-connector-bench-"))
    results = {"command": "bash deploy/dev.sh run python -m benchmarks.connector_bench "
                          + " ".join(argv if argv is not None else sys.argv[1:]),
               "machine": f"{platform.machine()}, {len(__import__('os').sched_getaffinity(0))} cores, "
                          f"Python {platform.python_version()}",
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "turns": args.turns, "connectors": {}}
    with contextlib.closing(engines(model, logs, "colocated")) as eng:
        ref = eng.ready(eng.start("engine", "decode", "none")).url
        conv = colocated_pass(ref, args.turns, salt=1)
    print(f"[connector-bench] colocated next-turn hits: {conv['cached_next']}", flush=True)
    for connector in args.connectors.split(","):
        with contextlib.closing(engines(model, logs, connector)) as eng:
            p, d = eng.start("prefill", "prefill", connector), eng.start("decode", "decode", connector)
            p, d = eng.ready(p).url, eng.ready(d).url
            rows = results["connectors"][connector] = pd_pass(p, d, conv)
        print(f"[connector-bench] {connector}: bytes {[r['bytes'] for r in rows]}, next-turn hits on D "
              f"{[r['cached_next_turn_on_d'] for r in rows]}", flush=True)
    sizes = sorted({r["bytes"] for rows in results["connectors"].values() for r in rows if r["bytes"]})
    raw = raw_read_gbps(sizes)
    for rows in results["connectors"].values():
        for r in rows:
            r["raw_read_gbps"] = raw.get(r["bytes"])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results | {"conversation": conv}, indent=1))
    (args.out / "summary.md").write_text(summarize(results))
    print(f"[connector-bench] wrote {args.out}/summary.md (logs: {logs})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
