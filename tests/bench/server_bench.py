"""CPU per request of the proxy's HTTP server (proxy/http_server.py) vs aiohttp's web server, for the same bare
answer (a request body read, a small JSON answer), on one core each.

    /root/.cache/hybrid-pd/venv/bin/python -m tests.bench.server_bench [--gap-ms 2] [--requests 1000]

Each server runs alone on core 0 in its own process (uvloop, access log off, aiohttp with handler
cancellation as the proxy had it); the client (this process, aiohttp) sends requests one at a time on a
keep-alive connection from core 1, `--gap-ms` apart (0: back to back, a warm path; 2: an idle gap before each,
as for requests that come at a decoder's pace, a cold path). CPU = user + system seconds of the server process
over the measured requests. Interleaved rounds, every server once per round; the median and each round's
ratio are printed. Every process started here is stopped by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time

import aiohttp
import psutil
import uvloop

from tests.bench.proxy_bench import HARNESS_CORE, PROXY_CORE, ROOT, stop_all, wait_healthy
from tests.support.procs import free_port

BODY = b'{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"hi","finish_reason":"length"}]}'
REQUEST = b'{"model":"m","prompt":"hello world","max_tokens":1}'


async def serve_aiohttp(port: int) -> None:
    from aiohttp import web

    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=BODY, content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/completions", answer)
    app.router.add_get("/health", lambda _: answer(_))
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()


async def serve_ours(port: int) -> None:
    from hybrid_pd.proxy.http_request import Request
    from hybrid_pd.proxy.http_server import HTTPServer

    async def answer(request: Request) -> None:
        request.respond(200, BODY)

    await HTTPServer.start("127.0.0.1", port, answer)
    await asyncio.Event().wait()


SERVERS = {"hybrid-pd http_server": serve_ours, "aiohttp web server": serve_aiohttp}


async def cpu_per_request(port: int, proc: psutil.Process, n: int, gap_s: float) -> float:
    url = f"http://127.0.0.1:{port}/v1/completions"
    async with aiohttp.ClientSession() as s:
        for _ in range(50):  # warm-up
            async with s.post(url, data=REQUEST) as r:
                await r.read()
        t = proc.cpu_times()
        for _ in range(n):
            async with s.post(url, data=REQUEST) as r:
                if r.status != 200 or await r.read() != BODY:
                    raise RuntimeError(f"bad answer from {url}: {r.status}")
            if gap_s:
                await asyncio.sleep(gap_s)
        t2 = proc.cpu_times()
        return (t2.user + t2.system - t.user - t.system) / n * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gap-ms", type=float, default=2.0)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    os.sched_setaffinity(0, {HARNESS_CORE})
    procs: list[subprocess.Popen] = []
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        ports = {}
        for name in SERVERS:
            ports[name] = free_port()
            argv = ["taskset", "-c", str(PROXY_CORE), sys.executable, "-m", "tests.bench.server_bench",
                    "--serve", name, str(ports[name])]
            procs.append(subprocess.Popen(argv, env=env))
        for proc, name in zip(procs, SERVERS):
            wait_healthy(f"http://127.0.0.1:{ports[name]}", proc)
        results: dict[str, list[float]] = {name: [] for name in SERVERS}
        for i in range(args.rounds):
            for proc, name in zip(procs, SERVERS):
                us = uvloop.run(cpu_per_request(ports[name], psutil.Process(proc.pid), args.requests,
                                                args.gap_ms / 1e3))
                results[name].append(us)
                print(f"round {i + 1} {name}: {us:.0f} us CPU per request", flush=True)
    finally:
        stop_all(procs)
    ours, theirs = results["hybrid-pd http_server"], results["aiohttp web server"]
    print(f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {args.requests} requests per round, "
          f"{args.gap_ms:g} ms apart; median CPU per request: hybrid-pd http_server {statistics.median(ours):.0f} us, "
          f"aiohttp web server {statistics.median(theirs):.0f} us; per-round ratio (ours/aiohttp) median "
          f"{statistics.median(a / b for a, b in zip(ours, theirs)):.2f}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--serve":
        uvloop.run(SERVERS[sys.argv[2]](int(sys.argv[3])))
    else:
        sys.exit(main())
