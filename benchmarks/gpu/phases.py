"""The phase probe's breakdown (bench.py `probe`: one request alone, every server's /metrics before and after it)
and the ratios merge.py takes from it: the PD tax, what our proxy adds to a turn, and our prefiller's prefill
against upstream's (prefill_probe.py's parts)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

XFER_S = ("vllm:hybrid_pd_xfer_time_seconds_sum", "vllm:nixl_xfer_time_seconds_sum")


def ms(v):
    return None if v is None else v * 1e3


def phase_row(p: dict, flow: str) -> dict:
    d = p["deltas"]
    eng = d.get("decode") or d.get("front", {})
    pre = d.get("prefill", {})
    front = d.get("front", {})
    g = lambda m, k: m.get(k)  # noqa: E731
    stage = lambda s: sum(v for k, v in front.items()  # noqa: E731
                          if k.startswith("hybrid_pd_proxy_stage_latency_seconds_sum") and f'"{s}"' in k) or None
    mode = [k.split("mode=")[1].split(",")[0].strip('"}') for k in front if "requests_total" in k and "mode=" in k]
    xfer = next((d.get("decode", {}).get(k) for k in XFER_S if d.get("decode", {}).get(k)), None)
    moved = next((d.get("decode", {}).get(k) for k in ("vllm:hybrid_pd_bytes_transferred_sum",
                                                         "vllm:nixl_bytes_transferred_sum")
                  if d.get("decode", {}).get(k)), 0)
    return {"phase": p["phase"], "turn": p["turn"], "prompt": p["prompt_tokens"], "hit": p["hit_tokens"],
            "oracle": p.get("oracle_hit"), "ttft_ms": ms(p["ttft_s"]), "mode": ",".join(mode) or flow,
            "tokenize_ms": ms(stage("tokenize")), "p_call_ms": ms(stage("prefill") or p.get("p_s")),
            "p_queue_ms": ms(g(pre, "vllm:request_queue_time_seconds_sum")),
            "p_prefill_ms": ms(g(pre, "vllm:request_prefill_time_seconds_sum")),
            "xfer_ms": ms(xfer), "bytes": moved,
            "d_queue_ms": ms(g(eng, "vllm:request_queue_time_seconds_sum")),
            "d_prefill_ms": ms(g(eng, "vllm:request_prefill_time_seconds_sum")),
            "d_ttft_ms": ms(g(eng, "vllm:time_to_first_token_seconds_sum"))} | derived(p, stage("prefill"), xfer, eng)


def derived(p: dict, p_stage, xfer, eng: dict) -> dict:
    """The brief's phases: the proxy and HTTP (client TTFT less P's call and D's own TTFT) and D's wait beyond
    the transfer (its queue time holds the wait for the KV)."""
    d_ttft = eng.get("vllm:time_to_first_token_seconds_sum")
    p_call = p_stage or p.get("p_s") or 0.0
    d_queue = eng.get("vllm:request_queue_time_seconds_sum")
    return {"glue_ms": ms(p["ttft_s"] - p_call - d_ttft) if p["ttft_s"] and d_ttft else None,
            "d_wait_ms": ms(d_queue - (xfer or 0.0)) if d_queue is not None else None}


def pd_tax(phases: dict, setup: str) -> float | None:
    """The PD tax (median over the probe's PD turns, ms): TTFT - (P's scheduled-to-first-token + READ + D's first
    step) - one engine's own HTTP path on the same turn (the colocated engine's TTFT - its scheduled-to-first-token)."""
    http = {(r["phase"], r["turn"]): r["ttft_ms"] - r["d_prefill_ms"] for r in phases.get("colocated", [])
            if r["ttft_ms"] is not None and r["d_prefill_ms"] is not None}
    tax = [r["ttft_ms"] - r["p_prefill_ms"] - (r["xfer_ms"] or 0.0) - r["d_prefill_ms"] - http[(r["phase"], r["turn"])]
           for r in phases.get(setup, []) if r["p_prefill_ms"] is not None and r["d_prefill_ms"] is not None
           and (r["phase"], r["turn"]) in http]
    return round(statistics.median(tax), 1) if tax else None


def proxy_added(phases: dict, setup: str) -> float | None:
    """What our proxy adds to a turn (median over the probe's turns `setup` served on D alone, ms): its client TTFT
    less D's own (vLLM's time_to_first_token: arrival to first token in the engine), against the same for the
    colocated engine straight from the client on the same turn (its HTTP path and API server alike)."""
    direct = {(r["phase"], r["turn"]): r["glue_ms"] for r in phases.get("colocated", []) if r["glue_ms"] is not None}
    added = [r["glue_ms"] - direct[(r["phase"], r["turn"])] for r in phases.get(setup, [])
             if r["glue_ms"] is not None and r["p_prefill_ms"] is None and (r["phase"], r["turn"]) in direct]
    return round(statistics.median(added), 2) if added else None


def prefill_vs_upstream(folder: Path, setup: str) -> float | None:
    """prefill_probe.py's parts under folder/probe, or in its subfolders (one run each: upstream's and ours side by
    side on two GPUs, then swapped): the paired median of `setup`'s P prefill over upstream's on the same prompts of
    one run, pooled over the runs (P legs only, the first prompt of each kind left out: it may meet a cold path)."""
    pairs = []
    for run in [folder / "probe", *sorted(p for p in (folder / "probe").glob("*") if p.is_dir())]:
        files = {f.stem.removeprefix("prefill-"): f for f in run.glob("prefill-*.json")}
        if setup not in files or "upstream" not in files:
            continue
        rows = {s: {r["label"]: r for r in json.loads(files[s].read_text())["rows"]} for s in (setup, "upstream")}
        pairs += [rows[setup][k]["prefill_ms"] / r["prefill_ms"] for k, r in rows["upstream"].items()
                  if r["p_leg"] and not k.endswith("#0") and k in rows[setup] and r["prefill_ms"]]
    return round(statistics.median(pairs), 3) if pairs else None
