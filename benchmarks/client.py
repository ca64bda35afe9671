"""What a benchmark asks of a server: a streamed completion with its token margins, a JSON call, and /metrics
read as numbers (all of them, one summed over its label sets, or the counters diffed per server: the phase
breakdown); the log line."""

from __future__ import annotations

import json
import time
import urllib.request

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


def http_json(url: str, body: dict | None = None, timeout: float = 120) -> dict:
    """GET `url`, or POST `body` as JSON; the answer's JSON."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def post_json(url: str, body: dict, timeout: float = 300) -> dict:
    return http_json(url, body, timeout)


def cached_of(usage: dict) -> int:
    return ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens") or 0


def scrape_metrics(url: str) -> dict[str, float]:
    """Every sample of `url`/metrics: `name{labels}` -> value."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        out = {}
        for line in r.read().decode().splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                try:
                    out[name] = float(value)
                except ValueError:
                    pass
        return out


def placement_rates(url: str) -> dict[str, float]:
    """Our proxy's placement model as it has learned it (hybrid_pd_proxy_placement_rate, by rate)."""
    prefix = 'hybrid_pd_proxy_placement_rate{rate="'
    return {k[len(prefix):-2]: v for k, v in scrape_metrics(url).items() if k.startswith(prefix)}


def metric_sum(metrics: dict[str, float], name: str) -> float:
    """Sum a metric over all its label sets (`name{...} value` lines)."""
    return sum(v for k, v in metrics.items() if k == name or k.startswith(name + "{"))


def is_counter(name: str) -> bool:
    """A counter, or a histogram's sum or count (bucket lines and gauges are not diffed)."""
    return name.endswith(("_sum", "_count", "_total")) or any(s in name for s in ("_total{", "_sum{", "_count{"))


def scrape(url: str) -> dict[str, float]:
    """The counters of `url`/metrics (is_counter)."""
    return {k: v for k, v in scrape_metrics(url).items() if is_counter(k)}


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
