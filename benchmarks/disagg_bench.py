"""Short prompts through the proxy, with and without the "uncached part under one aligned block stays on D" rule.

One P, one D (our connector, real engines, P on core 0, D on core 1) and one proxy at a time in front of them;
the proxy is restarted between rounds with `--min-uncached-blocks 1` or `0` (every prompt remote), under the
deprecated `--pd-policy hit-ratio` that rule belongs to (the default policy, ours, decides by predicted time:
benchmarks/pd_policy_bench.py).
Each round sends fresh prompts (nothing cached anywhere) of 40-195 words, one at a time, streamed; rounds
alternate so that both settings see the same engines in the same state. Prints TTFT p50/p90 per setting and
how many P calls the proxy made.

    bash deploy/dev.sh run python -m benchmarks.disagg_bench [--prompts 30] [--rounds 2]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.client import metric_sum, scrape_metrics
from benchmarks.procs import HYBRID_PD, Launched, free_port
from benchmarks.setups import events_url, start_pd_pair
from hybrid_pd.prefill.dev.demo_workload import stream
from hybrid_pd.prefill.dev.tiny_model import TinyModelSpec, build_tiny_model
from tests.support.conversation import text_of


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="disagg-bench-"))
    model = str(build_tiny_model(TinyModelSpec()))
    procs: list[Launched] = []
    try:
        workers = start_pd_pair(model, logs, procs, 300)
        ttft: dict[str, list[float]] = {"1": [], "0": []}
        p_calls = dict.fromkeys(ttft, 0.0)
        salt = 0
        for rnd in range(args.rounds):
            for setting in ("1", "0") if rnd % 2 == 0 else ("0", "1"):
                port = free_port()
                proxy = Launched(f"proxy-{setting}-{rnd}", [
                    HYBRID_PD, "proxy", "--port", str(port), "--prefill", workers["p"].url, "--decode",
                    workers["d"].url, "--prefill-events", events_url(workers["p"]),
                    "--decode-events", events_url(workers["d"]), "--pd-policy", "hit-ratio",
                    "--min-uncached-blocks", setting],
                    f"http://127.0.0.1:{port}", logs)
                procs.append(proxy)
                proxy.wait_healthy(60)
                for k in range(20):  # KV events teach the proxy the aligned block (a restarted proxy's SUB
                    # socket misses what the publishers sent before they reconnected)
                    stream(proxy.url, "/v1/completions", {"model": "tiny", "max_tokens": 2,
                                                          "prompt": text_of(300, 10**6 + 100 * rnd + k)})
                    if metric_sum(scrape_metrics(proxy.url), "hybrid_pd_proxy_kv_event_batches_total") > 0:
                        break
                    time.sleep(0.5)
                remote = 'hybrid_pd_proxy_disagg_decisions_total{decision="remote"}'
                before = metric_sum(scrape_metrics(proxy.url), remote)
                for i in range(args.prompts):
                    salt += 1
                    n_words = 40 + (i * 155) // max(args.prompts - 1, 1)
                    body = {"model": "tiny", "prompt": text_of(n_words, 7_000_000 + salt), "max_tokens": 8,
                            "temperature": 0.0, "ignore_eos": True}
                    ttft[setting].append(stream(proxy.url, "/v1/completions", body)[2])
                p_calls[setting] += metric_sum(scrape_metrics(proxy.url),
                                               'hybrid_pd_proxy_disagg_decisions_total{decision="remote"}') - before
                proxy.stop()
                procs.remove(proxy)
        print("| --min-uncached-blocks | requests | P calls | TTFT p50 ms | TTFT p90 ms |")
        print("|---|---|---|---|---|")
        for setting, values in ttft.items():
            q = statistics.quantiles(values, n=10)
            print(f"| {setting} | {len(values)} | {int(p_calls[setting])} | {statistics.median(values) * 1e3:.1f} | "
                  f"{q[8] * 1e3:.1f} |")
    finally:
        for proc in reversed(procs):
            proc.stop()


if __name__ == "__main__":
    main()
