"""What the one-GPU benchmark (bench_gpu.py) asks of a server: a streamed completion with its token margins, a
JSON call, and /metrics read as counters, summed and diffed per server (the phase breakdown); the log line."""

from __future__ import annotations

import json
import time

from hybrid_pd.prefill.dev.demo_workload import stream

T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[bench {time.monotonic() - T0:6.1f}s] {msg}", flush=True)


def stream_logprobs(url: str, body: dict, timeout: float = 300) -> dict:
    """Stream a completion: text, usage, token arrival times (from the call) and, when the body asks for
    `logprobs`, each generated token with its lead over the runner-up (demo_workload.stream)."""
    seen: list[tuple[str, float | None]] = []
    text, usage, _, arrivals = stream(url, "/v1/completions", body, timeout, margins=seen)
    return {"text": text, "usage": usage, "arrivals": arrivals, "tokens": [t for t, _ in seen],
            "margins": [m for _, m in seen]}


def post_json(url: str, body: dict, timeout: float = 300) -> dict:
    import urllib.request

    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def cached_of(usage: dict) -> int:
    return ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens") or 0


def scrape(url: str) -> dict[str, float]:
    import urllib.request

    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        out = {}
        for line in r.read().decode().splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                if name.endswith(("_sum", "_count", "_total")) or "_total{" in name or "_sum{" in name \
                        or "_count{" in name:
                    try:
                        out[name] = float(value)
                    except ValueError:
                        pass
        return out


def metric_deltas(before: dict, after: dict) -> dict:
    """Per server, the summed-over-labels change of every counter/sum that moved (bucket lines dropped)."""
    out = {}
    for server, a in after.items():
        b = before.get(server, {})
        moved: dict[str, float] = {}
        for name, value in a.items():
            d = value - b.get(name, 0.0)
            if d:
                base = name.split("{")[0]
                label = ""
                if base.startswith("hybrid_pd_proxy") or "stage" in name or "mode=" in name or "decision" in name:
                    label = name[len(base):]  # keep the proxy's labels (stage, mode, decision)
                key = base + label
                moved[key] = round(moved.get(key, 0.0) + d, 6)
        out[server] = moved
    return out
