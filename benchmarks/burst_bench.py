"""Routing a burst: new users sharing a system prompt on 2P1D, per prefill policy, with real engines.

Two prefillers (cores 0 and 1) and one decoder (cores 0-1, so that it weighs on both alike), our connector with
`--checkpoint-every 256` (the state at every aligned block is kept, so the shared system prompt is a usable hit),
and our proxy restarted per policy with every turn sent to a prefiller (`--pd-policy always-remote`;
formerly `--decoder-hit-ratio 1 --min-uncached-blocks 0`: this measures the prefiller choice alone). Per policy
and round:
1. a fresh system prompt S is sent once (it lands on one prefiller: the holder);
2. burst: `--burst` new users (S + a question of their own) at once;
3. sustained: a second fresh S', sent once, then `--stream` users arriving every `--interval-s`.
Recorded: TTFT p50/p99, requests per prefiller, and tokens computed (prompt tokens less prefix hits, summed
over all three engines' /metrics), for `kv_hit=2,least_loaded` (the proxy's default with KV events), plain
round robin, and `queue_cost` (tokens to compute before the first token: queue ahead + uncached part).
Policies rotate between rounds so that all meet the engines in the same states.

    bash deploy/dev.sh run python -m benchmarks.burst_bench [--rounds 2] [--burst 12] [--stream 16]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.client import metric_sum, scrape_metrics
from benchmarks.procs import HYBRID_PD, Launched, free_port
from benchmarks.setups import CpuBed, Workers
from hybrid_pd.prefill.dev.demo_workload import stream
from hybrid_pd.prefill.dev.tiny_model import TinyModelSpec, build_tiny_model
from tests.support.conversation import text_of

POLICIES = {"kv_hit=2,least_loaded": ("kv_hit=2,least_loaded", "round_robin"),
            "round robin": ("none", "round_robin"),
            "queue_cost": ("queue_cost", "round_robin")}
SYSTEM_WORDS, QUESTION_WORDS = 420, 40


def computed(urls: list[str]) -> float:
    """Prompt tokens the engines computed so far (prompt tokens less prefix-cache hits)."""
    total = 0.0
    for url in urls:
        m = scrape_metrics(url)
        total += metric_sum(m, "vllm:prompt_tokens_total") - metric_sum(m, "vllm:prefix_cache_hits_total")
    return total


def ask(url: str, prompt: str, out: list[dict], lock: threading.Lock) -> None:
    start = time.monotonic()
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 8, "temperature": 0.0, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    _, usage, ttft, _ = stream(url, "/v1/completions", body, 300)
    with lock:
        out.append({"ttft_s": ttft, "e2e_s": time.monotonic() - start,
                    "cached": ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens") or 0,
                    "prompt_tokens": (usage or {}).get("prompt_tokens", 0)})


def per_prefiller(proxy: Launched, prefill_urls: list[str]) -> list[float]:
    m = scrape_metrics(proxy.url)
    return [sum(v for k, v in m.items() if k.startswith("hybrid_pd_proxy_routing_decisions_total{")
                and 'role="prefill"' in k and f'worker="{u}"' in k) for u in prefill_urls]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--burst", type=int, default=12)
    ap.add_argument("--stream", type=int, default=16)
    ap.add_argument("--interval-s", type=float, default=0.25)
    ap.add_argument("--cores", default="0,1,0-1", help="P1, P2 and D's --cpu-bind, ';'-separated or as "
                    "P1,P2,D (default 0,1,0-1; '0;0;1' gives D a core of its own)")
    args = ap.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="burst-bench-"))
    model = str(build_tiny_model(TinyModelSpec()))
    procs: list[Launched] = []
    results: dict[str, dict[str, list]] = {p: {"burst": [], "sustained": [], "computed": [], "split": []}
                                           for p in POLICIES}
    try:
        workers, started = {}, {}
        cores = args.cores.split(";") if ";" in args.cores else args.cores.split(",")
        for name, role, core in zip(("p1", "p2", "d"), ("prefill", "prefill", "decode"), cores, strict=True):
            bed = CpuBed(model, extra=("--checkpoint-every", "256"), prefill_core=core, decode_core=core)
            started[name] = Workers(bed, logs)
            workers[name] = started[name].start(name, role, "hybrid")
            procs.append(workers[name])
        for name, w in workers.items():
            started[name].ready(w, 400)
        events = {k: w.argv[w.argv.index("--kv-events-port") + 1] for k, w in workers.items()}
        prefill_urls = [workers["p1"].url, workers["p2"].url]
        salt = 0
        for rnd in range(args.rounds):
            order = list(POLICIES) if rnd % 2 == 0 else list(reversed(POLICIES))
            for name in order:
                policy, picker = POLICIES[name]
                port = free_port()
                argv = [HYBRID_PD, "proxy", "--port", str(port), "--decode", workers["d"].url,
                        "--decode-events", f"tcp://127.0.0.1:{events['d']}", "--prefill-policy", policy,
                        "--prefill-picker", picker, "--pd-policy", "always-remote"]
                for k in ("p1", "p2"):
                    argv += ["--prefill", workers[k].url, "--prefill-events", f"tcp://127.0.0.1:{events[k]}"]
                proxy = Launched(f"proxy-{rnd}-{len(procs)}", argv, f"http://127.0.0.1:{port}", logs)
                procs.append(proxy)
                proxy.wait_healthy(60)
                urls = [w.url for w in workers.values()]
                lock = threading.Lock()
                before_tokens, before_split = computed(urls), per_prefiller(proxy, prefill_urls)
                for phase in ("burst", "sustained"):
                    salt += 1
                    system = text_of(SYSTEM_WORDS, 50_000 + salt)
                    ask(proxy.url, system + " " + text_of(QUESTION_WORDS, 60_000 + salt), [], lock)  # the holder
                    time.sleep(1.0)  # its KV events reach the proxy's index
                    out: list[dict] = []
                    threads = []
                    count = args.burst if phase == "burst" else args.stream
                    for _ in range(count):
                        salt += 1
                        prompt = system + " " + text_of(QUESTION_WORDS, 70_000 + salt)
                        threads.append(threading.Thread(target=ask, args=(proxy.url, prompt, out, lock)))
                        threads[-1].start()
                        if phase == "sustained":
                            time.sleep(args.interval_s)
                    for t in threads:
                        t.join(300)
                    results[name][phase] += out
                results[name]["computed"].append(computed(urls) - before_tokens)
                results[name]["split"].append([a - b for a, b in zip(per_prefiller(proxy, prefill_urls), before_split)])
                print(f"round {rnd} {name}: burst TTFT p50 "
                      f"{statistics.median(r['ttft_s'] for r in results[name]['burst'][-args.burst:]) * 1e3:.0f} ms, "
                      f"split {results[name]['split'][-1]}, computed {results[name]['computed'][-1]:.0f}", flush=True)
                proxy.stop()
                procs.remove(proxy)
        print("\n| policy | burst TTFT p50 ms | burst p99 ms | sustained p50 ms | sustained p99 ms | requests P1 / P2 "
              "| tokens computed | prompt tokens |")
        print("|---|---|---|---|---|---|---|---|")
        for name, r in results.items():
            def pq(rows, q):
                v = sorted(x["ttft_s"] for x in rows)
                return v[min(len(v) - 1, int(q * len(v)))] * 1e3
            split = [sum(s[i] for s in r["split"]) for i in range(2)]
            prompt = sum(x["prompt_tokens"] for x in r["burst"] + r["sustained"])
            print(f"| {name} | {pq(r['burst'], 0.5):.0f} | {pq(r['burst'], 0.99):.0f} | {pq(r['sustained'], 0.5):.0f} "
                  f"| {pq(r['sustained'], 0.99):.0f} | {split[0]:.0f} / {split[1]:.0f} | {sum(r['computed']):.0f} | "
                  f"{prompt} |")
    finally:
        for proc in reversed(procs):
            proc.stop()


if __name__ == "__main__":
    main()
