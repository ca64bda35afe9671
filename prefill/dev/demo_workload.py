"""What the demo (and the GPU integration script) sends and measures, over plain HTTP.

Each request streams, so time to first token (TTFT) and inter-token latency (ITL) are measured where the
client sees them; `usage` (prompt, cached and completion tokens) comes with the last chunk. Transfer figures
are read from the decoder's /metrics (the connector's NIXL counters) before and after the workload.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
import urllib.request
from typing import Any

TRANSFER_METRICS = {  # the decoder connector's counters, summed over label sets: (upstream's, ours)
    "bytes": ("vllm:nixl_bytes_transferred_sum", "vllm:hybrid_pd_bytes_transferred_sum"),
    "descriptors": ("vllm:nixl_num_descriptors_sum", "vllm:hybrid_pd_descriptors_sum"),
    "transfers": ("vllm:nixl_xfer_time_seconds_count", "vllm:hybrid_pd_xfer_time_seconds_count"),
    "transfer_seconds": ("vllm:nixl_xfer_time_seconds_sum", "vllm:hybrid_pd_xfer_time_seconds_sum"),
    "failed_transfers": ("vllm:nixl_num_failed_transfers_total", "vllm:hybrid_pd_failed_transfers_total"),
}
SYSTEM = (
    "You are a helpful agent. The quick brown fox jumps over the lazy dog; the prefix cache keeps the "
    "mamba state of every attention block. "
) * 12
TURNS = ["Which engine decodes this request?", "And which one prefills it?", "Say hello world one two three."]


@dataclasses.dataclass
class Result:
    name: str
    text: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    ttft_s: float
    itl_s: float  # mean gap between streamed tokens after the first
    reference_text: str | None = None

    @property
    def matches_reference(self) -> bool | None:
        return None if self.reference_text is None else self.text == self.reference_text


def stream(
    url: str,
    path: str,
    body: dict,
    timeout: float = 300,
    margins: list[tuple[str, float | None]] | None = None,
    token_ids: list[int] | None = None,
) -> tuple[str, dict, float, list[float]]:
    """POST a streaming request; return (text, usage, ttft, token arrival times). With `margins` (and a body
    asking for `logprobs`), each generated token and how far its log-probability leads the runner-up's are
    appended to it (a near-tie lets two correct engines part ways); with `token_ids` (and `return_token_ids` in
    the body), the generated ids."""
    body = dict(body, stream=True, stream_options={"include_usage": True})
    req = urllib.request.Request(
        url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    start = time.monotonic()
    text: list[str] = []
    usage: dict[str, Any] = {}
    arrivals: list[float] = []
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or []:
                piece = choice.get("text") or (choice.get("delta") or {}).get("content") or ""
                if piece:
                    arrivals.append(time.monotonic() - start)
                    text.append(piece)
                if token_ids is not None:
                    token_ids += choice.get("token_ids") or []
                if margins is not None:
                    lp = choice.get("logprobs") or {}
                    for tok, top in zip(lp.get("tokens") or [], lp.get("top_logprobs") or []):
                        best = sorted((top or {}).values(), reverse=True)
                        margins.append((tok, round(best[0] - best[1], 4) if len(best) > 1 else None))
    return "".join(text), usage, (arrivals[0] if arrivals else float("nan")), arrivals


def run_request(url: str, name: str, body: dict, chat: bool) -> Result:
    text, usage, ttft, arrivals = stream(url, "/v1/chat/completions" if chat else "/v1/completions", body)
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    return Result(
        name=name,
        text=text,
        prompt_tokens=usage.get("prompt_tokens", 0),
        cached_tokens=(usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0,
        completion_tokens=usage.get("completion_tokens", 0),
        ttft_s=ttft,
        itl_s=statistics.fmean(gaps) if gaps else float("nan"),
    )


def workload(model: str, max_tokens: int = 16) -> list[tuple[str, dict, bool]]:
    """A completion and a multi-turn chat whose history grows (each turn extends the previous prompt)."""
    common = {"model": model, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    items = [("completion", dict(common, prompt=SYSTEM + TURNS[0]), False)]
    history = [{"role": "system", "content": SYSTEM}]
    for i, question in enumerate(TURNS):
        history = history + [{"role": "user", "content": question}]
        items.append((f"chat turn {i + 1}", dict(common, messages=list(history)), True))
        history.append({"role": "assistant", "content": f"answer {i + 1}: the decode engine"})
    return items


def transfer_counters(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        lines = [ln for ln in r.read().decode().splitlines() if ln and not ln.startswith("#")]
    return {
        key: sum(float(ln.rpartition(" ")[2]) for ln in lines if ln.split("{")[0].split(" ")[0] in names)
        for key, names in TRANSFER_METRICS.items()
    }


def run_workload(proxy_url: str, decode_url: str, model: str, reference_url: str | None = None) -> dict:
    before = transfer_counters(decode_url)
    results = []
    for name, body, chat in workload(model):
        result = run_request(proxy_url, name, body, chat)
        if reference_url:
            result.reference_text = run_request(reference_url, name, body, chat).text
        results.append(result)
    after = transfer_counters(decode_url)
    return {
        "requests": [dataclasses.asdict(r) | {"matches_reference": r.matches_reference} for r in results],
        "transfer": {k: after[k] - before[k] for k in after},
    }


def format_report(report: dict) -> str:
    lines = [f"{'request':<14} {'prompt':>6} {'cached':>6} {'TTFT ms':>8} {'ITL ms':>7}  equal  text"]
    for r in report["requests"]:
        eq = {True: "yes", False: "NO", None: "-"}[r["matches_reference"]]
        lines.append(
            f"{r['name']:<14} {r['prompt_tokens']:>6} {r['cached_tokens']:>6} {r['ttft_s'] * 1e3:>8.1f} "
            f"{r['itl_s'] * 1e3:>7.1f}  {eq:<5}  {r['text'][:40]!r}"
        )
    t = report["transfer"]
    lines.append(
        f"moved P->D over NIXL: {t['bytes']:.0f} bytes in {t['transfers']:.0f} transfers, "
        f"{t['descriptors']:.0f} descriptors, {t['transfer_seconds'] * 1e3:.1f} ms, "
        f"{t['failed_transfers']:.0f} failed"
    )
    return "\n".join(lines)
