"""Proxy overhead benchmark: the PD flow through our proxy, vllm-router and vLLM's toy-proxy design, on fake workers.

    /root/.cache/hybrid-pd/venv/bin/python -m benchmarks.proxy_bench [--out table.md]      (~3 minutes)

Peers, all in front of the same fake prefill + decode workers (benchmarks/proxy_fake_workers.py: P answers
with kv_transfer_params, D streams SSE, like vLLM's PD endpoints):
  - direct: the fake decoder alone, no prefill call, no proxy: the floor;
  - hybrid-pd proxy (`python -m hybrid_pd.proxy.server`, default flags);
  - vllm-router 0.1.17 (`--vllm-pd-disaggregation --policy round_robin`), installed into its own venv
    (--router-venv, created by this script on first use: `python3.11 -m venv`, `pip install vllm-router==0.1.17`);
    never into the project's dependencies;
  - toy proxy: the design of vLLM's examples/.../disagg_proxy `toy_proxy_server.py` (FastAPI + httpx, P then D);
  - with --baseline REV: our proxy as of git revision REV as well (an A/B of a proxy change in one run);
  - with --baseline-dir DIR: our proxy as installed in DIR as well (the mypyc build against the pure one).

Every proxy runs under `taskset -c 0` (one core each, one at a time under load); the fake workers and the load
generator (this process) run on core 1. For each round (--rounds, interleaved: round 1 measures every peer,
then round 2 ...), and each peer:
  1. concurrency 1, --c1-requests streamed completions: end-to-end latency; added latency = the peer's
     p50/p99 minus direct's p50/p99 of the same round;
  2. concurrency 64 for --c64-seconds (after a warm-up): completed requests/s;
  3. CPU seconds of the proxy's process tree (psutil, user + system) across each phase, per request.
The table reports the median of the rounds. The machine is shared and small: compare rows of one run.
Every process started here is stopped by PID at exit; everything binds 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import psutil
import uvloop

from benchmarks.procs import free_port

PY = sys.executable
ROOT = Path(__file__).resolve().parents[1]  # the repository (benchmarks/ is one of its folders)
ROUTER_VERSION = "0.1.17"
DEFAULT_ROUTER_VENV = Path("/root/.cache/hybrid-pd/bench-venv")
PROXY_CORE, HARNESS_CORE = 0, 1
CODE_FOLDERS = ("proxy", "prefill", "decode", "connector")  # what the hybrid_pd package is made of (pyproject.toml)

TOY_PROXY = textwrap.dedent("""
    # The shape of vLLM's toy_proxy_server.py: FastAPI + one httpx.AsyncClient per worker, P then D.
    import os, httpx
    from fastapi import FastAPI, Request
    from fastapi.responses import StreamingResponse
    app = FastAPI()
    P = httpx.AsyncClient(base_url=os.environ["P_URL"], timeout=None)
    D = httpx.AsyncClient(base_url=os.environ["D_URL"], timeout=None)

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        p_body = dict(body, max_tokens=1, stream=False, kv_transfer_params={
            "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
            "remote_block_ids": None, "remote_host": None, "remote_port": None})
        p_body.pop("stream_options", None)
        r = await P.post("/v1/completions", json=p_body)
        d_body = dict(body, kv_transfer_params=r.json().get("kv_transfer_params"))
        async def gen():
            async with D.stream("POST", "/v1/completions", json=d_body) as resp:
                async for chunk in resp.aiter_bytes():
                    yield chunk
        return StreamingResponse(gen(), media_type="text/event-stream")

    @app.get("/health")
    async def health():
        return {"ok": True}
""")


def ensure_router(venv: Path) -> Path:
    """The vllm-router launcher in its own venv; installs it there on first use (bounded by a timeout)."""
    exe = venv / "bin" / "vllm-router"
    if not exe.exists():
        subprocess.run(["python3.11", "-m", "venv", str(venv)], check=True, timeout=300)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", f"vllm-router=={ROUTER_VERSION}"], check=True,
                       timeout=900)
    return exe


def wait_healthy(url: str, proc: subprocess.Popen | None, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{url}: process exited with {proc.returncode} before it was healthy")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} not healthy after {timeout}s")


@dataclass
class Peer:
    name: str
    url: str
    proc: psutil.Process | None  # the proxy process, None for direct

    def cpu_s(self) -> float:
        if self.proc is None:
            return 0.0
        total = 0.0
        for p in [self.proc, *self.proc.children(recursive=True)]:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.NoSuchProcess:
                pass
        return total


BODY = {"model": "fake-model", "prompt": "hello world " * 50, "max_tokens": 32, "stream": True}


async def one_request(s: aiohttp.ClientSession, url: str, tokens: int) -> float:
    t0 = time.perf_counter()
    async with s.post(url + "/v1/completions", json=BODY) as r:
        data = await r.read()
    took = time.perf_counter() - t0
    if BODY["stream"]:
        ok = data.count(b"data: {") == tokens and data.endswith(b"data: [DONE]\n\n")
    else:
        ok = data.startswith(b"{") and data.count(b" t") == tokens
    if r.status != 200 or not ok:
        raise RuntimeError(f"{url}: bad answer {r.status} {data[:300]!r}")
    return took


async def latency_c1(url: str, n: int, tokens: int, cap_s: float,
                     cpu: Callable[[], float]) -> tuple[list[float], float]:
    """(latencies, proxy CPU seconds spent on them) of `n` sequential requests, capped at `cap_s` seconds."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        for _ in range(20):  # warm-up: connection, code paths
            await one_request(s, url, tokens)
        out: list[float] = []
        cpu0 = cpu()
        deadline = time.perf_counter() + cap_s
        while len(out) < n and time.perf_counter() < deadline:
            out.append(await one_request(s, url, tokens))
        return out, cpu() - cpu0


async def throughput(url: str, concurrency: int, seconds: float, tokens: int,
                     cpu: Callable[[], float]) -> tuple[int, float, float]:
    """(requests completed, wall seconds, proxy CPU seconds) of `concurrency` closed-loop clients for about
    `seconds`, after a warm-up. Requests still in flight at the end are waited for and counted."""
    done = 0

    async def client(s: aiohttp.ClientSession, until: float, count: bool) -> None:
        nonlocal done
        while time.perf_counter() < until:
            await one_request(s, url, tokens)
            done += count

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        warm = time.perf_counter() + min(1.0, seconds / 4)
        await asyncio.gather(*(client(s, warm, False) for _ in range(concurrency)))
        cpu0 = cpu()
        t = time.perf_counter()
        await asyncio.gather(*(client(s, t + seconds, True) for _ in range(concurrency)))
        return done, time.perf_counter() - t, cpu() - cpu0


def pct(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))] * 1e3


def measure(peer: Peer, args: argparse.Namespace) -> dict[str, float]:
    lat, cpu_c1 = uvloop.run(latency_c1(peer.url, args.c1_requests, args.tokens, args.c1_cap_s, peer.cpu_s))
    n, wall, cpu_c64 = uvloop.run(throughput(peer.url, args.concurrency, args.c64_seconds, args.tokens, peer.cpu_s))
    return {"p50": pct(lat, 0.5), "p99": pct(lat, 0.99), "n_c1": len(lat), "cpu_ms_c1": cpu_c1 * 1e3 / len(lat),
            "rps": n / wall, "cpu_ms_c64": cpu_c64 * 1e3 / max(n, 1), "core_util": cpu_c64 / wall}


def start_all(args: argparse.Namespace, tmp: str, procs: list[subprocess.Popen]) -> list[Peer]:
    p_port, d_port, ours_port, router_port, router_metrics, toy_port = (free_port() for _ in range(6))
    p_url, d_url = f"http://127.0.0.1:{p_port}", f"http://127.0.0.1:{d_port}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "P_URL": p_url, "D_URL": d_url}
    (Path(tmp) / "toy_proxy.py").write_text(TOY_PROXY)
    on_proxy_core = ["taskset", "-c", str(PROXY_CORE)]
    quiet = {"env": env, "stdout": subprocess.DEVNULL, "stderr": open(Path(tmp) / "stderr.log", "w")}  # noqa: SIM115 (the children write it until the end)

    def launch(argv: list[str], extra_env: dict[str, str] | None = None) -> subprocess.Popen:
        procs.append(subprocess.Popen(argv, **{**quiet, "env": {**env, **(extra_env or {})}}))
        return procs[-1]

    workers = launch(["taskset", "-c", str(HARNESS_CORE), PY, "-m", "benchmarks.proxy_fake_workers", str(p_port),
                      str(d_port), str(args.tokens), str(args.token_interval_ms)])
    launched = [("direct (decoder alone)", d_url, workers, None)]
    ours = launch([*on_proxy_core, PY, "-m", "hybrid_pd.proxy.server", "--port", str(ours_port), "--prefill", p_url,
                   "--decode", d_url, "--log-level", "WARNING"])
    launched.append(("hybrid-pd proxy", f"http://127.0.0.1:{ours_port}", ours, ours))
    if args.baseline:
        base_port = free_port()
        base = launch([*on_proxy_core, PY, "-m", "hybrid_pd.proxy.server", "--port", str(base_port), "--prefill", p_url,
                       "--decode", d_url, "--log-level", "WARNING"], {"PYTHONPATH": checkout(args.baseline, tmp)})
        launched.append((f"hybrid-pd proxy @{args.baseline}", f"http://127.0.0.1:{base_port}", base, base))
    if getattr(args, "baseline_dir", None):
        dir_port = free_port()
        built = launch([*on_proxy_core, PY, "-m", "hybrid_pd.proxy.server", "--port", str(dir_port), "--prefill", p_url,
                        "--decode", d_url, "--log-level", "WARNING"], {"PYTHONPATH": str(args.baseline_dir)})
        name = f"hybrid-pd proxy from {args.baseline_dir.name}"
        launched.append((name, f"http://127.0.0.1:{dir_port}", built, built))
    if not args.no_router:
        router = launch([*on_proxy_core, str(ensure_router(args.router_venv)), "--vllm-pd-disaggregation",
                         "--prefill", p_url, "--decode", d_url, "--host", "127.0.0.1", "--port", str(router_port),
                         "--prometheus-host", "127.0.0.1", "--prometheus-port", str(router_metrics),
                         "--policy", "round_robin", "--log-level", "warning"])
        launched.append((f"vllm-router {ROUTER_VERSION}", f"http://127.0.0.1:{router_port}", router, router))
    toy = launch([*on_proxy_core, PY, "-m", "uvicorn", "--app-dir", tmp, "toy_proxy:app", "--port", str(toy_port),
                  "--host", "127.0.0.1", "--log-level", "warning", "--no-access-log"])
    launched.append(("toy proxy (FastAPI+httpx)", f"http://127.0.0.1:{toy_port}", toy, toy))
    wait_healthy(p_url, workers)
    peers = []
    for name, url, proc, proxy in launched:
        wait_healthy(url, proc)
        peers.append(Peer(name, url, psutil.Process(proxy.pid) if proxy is not None else None))
    return peers


def checkout(rev: str, tmp: str) -> str:
    """The project's code folders as of `rev`, importable as hybrid_pd from the returned directory (put first on
    PYTHONPATH, it wins over the editable install)."""
    src, pkg = Path(tmp) / "baseline-src", Path(tmp) / "baseline" / "hybrid_pd"
    src.mkdir()
    pkg.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, *CODE_FOLDERS], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    (pkg / "__init__.py").write_text("")
    for folder in CODE_FOLDERS:
        (pkg / folder).symlink_to(src / folder)
    return str(pkg.parent)


def stop_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                for child in psutil.Process(p.pid).children(recursive=True):
                    child.terminate()
            except psutil.NoSuchProcess:
                pass
            p.terminate()
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


def report(rounds: list[dict[str, dict[str, float]]], args: argparse.Namespace) -> str:
    names = list(rounds[0])
    direct = names[0]

    def med(name: str, key: str) -> float:
        return statistics.median(r[name][key] for r in rounds)

    def added(name: str, key: str) -> float:
        return statistics.median(r[name][key] - r[direct][key] for r in rounds)

    lines = ["| set-up | added p50 ms | added p99 ms | e2e p50 ms | e2e p99 ms | CPU ms/req c=1 | "
             f"CPU ms/req c={args.concurrency} | req/s c={args.concurrency} | proxy core busy |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name in names:
        if name == direct:
            lines.append(f"| {name} | - | - | {med(name, 'p50'):.2f} | {med(name, 'p99'):.2f} | - | - | "
                         f"{med(name, 'rps'):.0f} | - |")
            continue
        lines.append(f"| {name} | {added(name, 'p50'):.2f} | {added(name, 'p99'):.2f} | {med(name, 'p50'):.2f} | "
                     f"{med(name, 'p99'):.2f} | {med(name, 'cpu_ms_c1'):.3f} | {med(name, 'cpu_ms_c64'):.3f} | "
                     f"{med(name, 'rps'):.0f} | {100 * med(name, 'core_util'):.0f}% |")
    ratios = _ratios_to(rounds, names, args, next((n for n in names if n.startswith("vllm-router")), None))
    ratios += _ratios_to(rounds, names, args, next((n for n in names if n.startswith("hybrid-pd proxy @")), None))
    per_round = ["", f"Per round (added p50 ms / req/s c={args.concurrency} / CPU ms/req c={args.concurrency}):", ""]
    for name in names[1:]:
        cells = [f"{r[name]['p50'] - r[direct]['p50']:.2f} / {r[name]['rps']:.0f} / {r[name]['cpu_ms_c64']:.3f}"
                 for r in rounds]
        per_round.append(f"- {name}: " + "; ".join(cells))
    return "\n".join(lines + ratios + per_round) + "\n"


def _ratios_to(rounds: list[dict[str, dict[str, float]]], names: list[str], args: argparse.Namespace,
               router: str | None) -> list[str]:
    """Each peer over `router` (vllm-router, or our --baseline), per round (both measured minutes apart on the
    same machine), median of the rounds: the machine is shared, and a ratio within a round is steadier than a
    ratio of medians."""
    if router is None:
        return []
    direct = names[0]

    def ratio(name: str, key: str) -> float:
        def value(r: dict[str, dict[str, float]], who: str) -> float:
            return r[who][key] - r[direct][key] if key in ("p50", "p99") else r[who][key]
        return statistics.median(value(r, name) / value(r, router) if value(r, router) > 0 else float("nan")
                                 for r in rounds)

    c = args.concurrency
    out = ["", f"Over {router} (median of per-round ratios; below 1 is better, but for req/s):", "",
           f"| set-up | added p50 | added p99 | CPU/req c=1 | CPU/req c={c} | req/s c={c} |",
           "|---|---|---|---|---|---|"]
    for name in names[1:]:
        if name != router:
            out.append(f"| {name} | {ratio(name, 'p50'):.2f} | {ratio(name, 'p99'):.2f} | "
                       f"{ratio(name, 'cpu_ms_c1'):.2f} | "
                       f"{ratio(name, 'cpu_ms_c64'):.2f} | {ratio(name, 'rps'):.2f} |")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--c1-requests", type=int, default=300)
    ap.add_argument("--c1-cap-s", type=float, default=20.0, help="time cap of the concurrency-1 phase")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--c64-seconds", type=float, default=6.0)
    ap.add_argument("--tokens", type=int, default=32, help="SSE events per streamed answer")
    ap.add_argument("--token-interval-ms", type=float, default=0.0,
                    help="the fake decoder sleeps this long between events (0: it only yields)")
    ap.add_argument("--no-stream", action="store_true", help="non-streamed completions (D answers one JSON)")
    ap.add_argument("--router-venv", type=Path, default=DEFAULT_ROUTER_VENV)
    ap.add_argument("--no-router", action="store_true", help="leave vllm-router out")
    ap.add_argument("--only", default="", help="comma-separated substrings of peer names to measure (and direct)")
    ap.add_argument("--baseline", default="", metavar="REV",
                    help="also measure our proxy as of this git revision (an A/B of a change, in one run)")
    ap.add_argument("--baseline-dir", type=Path, default=None, metavar="DIR",
                    help="also measure our proxy as installed in DIR (e.g. the mypyc build: pip install --target DIR)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    BODY["max_tokens"] = args.tokens
    BODY["stream"] = not args.no_stream
    if os.cpu_count() is None or os.cpu_count() < 2:
        raise SystemExit("needs 2 cores: one for the proxy, one for the workers and the load generator")
    os.sched_setaffinity(0, {HARNESS_CORE})
    procs: list[subprocess.Popen] = []
    rounds: list[dict[str, dict[str, float]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            peers = start_all(args, tmp, procs)
            if args.only:
                keep = args.only.split(",")
                peers = [p for i, p in enumerate(peers) if i == 0 or any(k in p.name for k in keep)]
            for i in range(args.rounds):
                row = {}
                for peer in peers:
                    row[peer.name] = measure(peer, args)
                    print(f"round {i + 1} {peer.name}:", {k: round(v, 3) for k, v in row[peer.name].items()},
                          flush=True)
                rounds.append(row)
        except BaseException:
            log = Path(tmp) / "stderr.log"
            if log.exists():
                print("stderr of the started processes (tail):\n" + log.read_text()[-3000:], file=sys.stderr)
            raise
        finally:
            stop_all(procs)
    table = report(rounds, args)
    head = (f"Machine: {platform.machine()}, {os.cpu_count()} cores (proxy on core {PROXY_CORE}; fake workers + load "
            f"generator on core {HARNESS_CORE}), Python {platform.python_version()}; "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. {args.rounds} interleaved rounds, medians; "
            f"{'not streamed, ' if args.no_stream else ''}{args.tokens} tokens per answer"
            f"{'' if args.no_stream else ' (SSE events)'}, {args.token_interval_ms:g} ms apart; "
            f"c=1: {args.c1_requests} requests; c={args.concurrency}: "
            f"{args.c64_seconds:g} s.\n\n")
    print(head + table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(head + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
