"""Cost curves of one engine kind, fitted to a GPU results folder (benchmarks/results/<run>/part-*.json[.gz]).

What each measurement fits (the probes are single requests, each with every server's /metrics before and after):

    prefill step     s0 + s1 * tokens + s2 * tokens * context     vllm:request_prefill_time of P (and of the
                     + s3 * requests prefilling in the step        colocated engine / a D-local turn) and the
                     (per step; a prefill is align mode's chunks)   launcher's warm-up lines, least squares over
                                                                    the steps each ran (fleetsim_engine); s3, which
                                                                    single requests cannot show, from one loaded
                                                                    run (fleetsim.calibrate: c=8 at 8k)
    decode step      d0 + d1 * requests in the step                 ITL p50 at c=1, and the decoder with 32 streams
                                                                    and no prefill load (decode_alone)
    READ             read0 + bytes / read_bw                        the decoder's xfer time and bytes per probe;
                     bytes = bytes_per_block * blocks moved         bytes of the cold probes' first turns
    hops             p_hop: proxy -> P -> proxy (HTTP, both ways)   P's call minus its queue and prefill
                     read_poll: D sees a READ done at its next poll D's queue time minus the READ
                     front: proxy + D's HTTP until the first byte   TTFT minus P's call minus D's TTFT (remote);
                     front_local                                    TTFT minus the engine's TTFT (local)
"""

from __future__ import annotations

import gzip
import json
import re
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .fleetsim_engine import chunks_of

# the launcher's warm-up lines in the drivers' logs: "warm-up: 8192 tokens 150 ms; 8256 after 8192 67 ms; ..."
WARMUP = re.compile(r"warm-up: ([^\n]*)")
WARMUP_ITEM = re.compile(r"(?P<n>\d+) (?:tokens|after (?P<after>\d+)) (?P<ms>\d+) ms")
WARMUP_HOP_S = 0.005  # the launcher's request to its own engine: HTTP and one sampled token
WARMUP_MAX_STEP_S = 0.150


def boundary_ends(start: int, end: int, block: int, max_batched: int) -> list[tuple[int, int]]:
    """(tokens, end) of the prefill steps of [start, end) that end on a block boundary: the checkpoints kept."""
    return [(c, x + c) for c, x in chunks_of(start, end, block, max_batched) if (x + c) % block == 0]


@dataclass(frozen=True)
class CostModel:
    s0: float
    s1: float
    s2: float
    d0: float
    d1: float
    read0: float
    read_bw: float
    bytes_per_block: float
    p_hop: float
    read_poll: float
    front: float
    front_local: float
    block: int
    s3: float = 0.0  # per prefilling request in an eager step: fitted to one loaded run (fleetsim.calibrate)
    max_batched: int = 8192
    max_seqs: int = 32
    source: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def load_part(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def _sum(deltas: dict, role: str, name: str) -> float | None:
    metric, _, labels = name.partition("{")
    v = deltas.get(role, {}).get(metric + "_sum" + ("{" + labels if labels else ""))
    return float(v) if v is not None else None


def nonnegative_fit(x: np.ndarray, y: np.ndarray) -> list[float]:
    """Least squares with every coefficient >= 0: a negative one is dropped (0) and the rest refitted."""
    keep = list(range(x.shape[1]))
    while True:
        a, *_ = np.linalg.lstsq(x[:, keep], y, rcond=None)
        if (a >= 0).all():
            out = [0.0] * x.shape[1]
            for i, v in zip(keep, a):
                out[i] = float(v)
            return out
        keep.pop(int(np.argmin(a)))


def fit(folder: Path, p_to_boundary: bool = False) -> CostModel:
    """The cost curves of the engines of one results folder. `p_to_boundary`: how P computed in that run (every
    GPU run so far predates P stopping at the block boundary: P computed N-1 tokens)."""
    parts = [load_part(p) for p in sorted(folder.glob("part-*.json*"))]
    block = next(int(p["block"]) for p in parts if p.get("block"))
    steps, times = [], []  # per prefill: [n_steps, tokens, tokens x context], seconds
    p_hop, poll, front, front_local, reads, bytes_cold = [], [], [], [], [], []
    itl1, itl_busy = [], []
    max_batched = int(parts[0]["args"].get("max_num_batched_tokens", 8192))
    max_seqs = int(parts[0]["args"].get("max_num_seqs", 32))

    def add_prefill(start: int, end: int, seconds: float | None) -> None:
        if seconds is None or seconds <= 0:
            return
        ch = chunks_of(start, end, block, max_batched)
        steps.append([len(ch), sum(c for c, _ in ch), sum(c * (x + c / 2) for c, x in ch)])
        times.append(seconds)

    for text in (p.read_text(errors="replace") for p in sorted(folder.glob("*driver*.txt"))):
        for line in WARMUP.findall(text):
            for m in WARMUP_ITEM.finditer(line):
                total, after, ms = int(m["n"]), int(m["after"] or 0), float(m["ms"]) / 1e3 - WARMUP_HOP_S
                hit = max((e for _, e in boundary_ends(0, after, block, max_batched) if e < total), default=0)
                if ms / max(1, len(chunks_of(hit, total, block, max_batched))) < WARMUP_MAX_STEP_S:
                    add_prefill(hit, total, ms)  # (a step far slower than any probe's is a kernel compile)
    for part in parts:
        setup = part["setup"]
        for pr in part.get("probe", []):
            d, n, hit, ttft = pr["deltas"], pr["prompt_tokens"], pr["hit_tokens"] or 0, pr["ttft_s"]
            if setup == "colocated":
                add_prefill(hit, n, _sum(d, "front", "vllm:request_prefill_time_seconds"))
                eng = _sum(d, "front", "vllm:time_to_first_token_seconds")
                if eng is not None:
                    front_local.append(ttft - eng)
                continue
            p_pre = _sum(d, "prefill", "vllm:request_prefill_time_seconds")
            d_ttft = _sum(d, "decode", "vllm:time_to_first_token_seconds")
            xfer = _sum(d, "decode", "vllm:hybrid_pd_xfer_time_seconds")
            nbytes = _sum(d, "decode", "vllm:hybrid_pd_bytes_transferred")
            if setup == "hybrid-pd-1p1d" and not p_pre:  # a D-local turn
                add_prefill(hit, n, _sum(d, "decode", "vllm:request_prefill_time_seconds"))
                if d_ttft is not None:
                    front_local.append(ttft - d_ttft)
                continue
            add_prefill(hit, (n - 1) // block * block if p_to_boundary else n - 1, p_pre)
            if setup != "hybrid-pd-1p1d":
                continue
            call = _sum(d, "front", 'hybrid_pd_proxy_stage_latency_seconds{stage="prefill"}')
            p_queue = _sum(d, "prefill", "vllm:request_queue_time_seconds") or 0.0
            d_queue = _sum(d, "decode", "vllm:request_queue_time_seconds")
            if call and p_pre:
                p_hop.append(call - p_pre - p_queue)
            if call and d_ttft is not None:
                front.append(ttft - call - d_ttft)
            if xfer and nbytes:
                reads.append((nbytes, xfer))
                if d_queue is not None:
                    poll.append(max(0.0, d_queue - xfer))
                if pr["turn"] == 0:
                    bytes_cold.append(nbytes / -(-(n - 1) // block))
        for run in part.get("runs", []):
            if run["concurrency"] == 1 and setup == "hybrid-pd-1p1d":
                itl1 += [r["itl_s"] for r in run["rows"] if r.get("itl_s")]
        for da in part.get("decode_alone") or []:
            if da.get("itl_p50_ms"):
                itl_busy.append((da["concurrency"], da["itl_p50_ms"] / 1e3))

    s0, s1, s2 = nonnegative_fit(np.array(steps, float), np.array(times, float))
    d_one = statistics.median(itl1)
    if itl_busy:
        n, t = max(itl_busy)
        d1 = max(0.0, (t - d_one) / (n - 1))
    else:
        d1 = 0.0
    x = np.array([[1.0, b] for b, _ in reads])
    (r0, per_byte), *_ = np.linalg.lstsq(x, np.array([s for _, s in reads]), rcond=None)
    return CostModel(
        s0=s0,
        s1=s1,
        s2=s2,
        d0=d_one - d1,
        d1=d1,
        read0=max(0.0, float(r0)),
        read_bw=1.0 / per_byte if per_byte > 0 else 1e12,
        bytes_per_block=statistics.median(bytes_cold) if bytes_cold else 0.0,
        p_hop=statistics.median(p_hop) if p_hop else 0.0,
        read_poll=statistics.median(poll) if poll else 0.0,
        front=statistics.median(front) if front else 0.0,
        front_local=statistics.median(front_local) if front_local else 0.0,
        block=block,
        max_batched=max_batched,
        max_seqs=max_seqs,
        source=str(folder),
    )
