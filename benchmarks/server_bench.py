"""CPU per request of the proxy's HTTP server (proxy/http_server.py) against the kept libraries it could be
replaced by, serving the same answers on one core each: aiohttp's web server (Application + AppRunner, as the
proxy had it), aiohttp's low-level `web.Server`, uvicorn's httptools protocol with a bare ASGI callable, and
granian (Rust, RSGI, one worker with one runtime thread).

    bash deploy/dev.sh run python -m benchmarks.server_bench [--gap-ms 2] [--requests 1000]
    bash deploy/dev.sh run python -m benchmarks.server_bench --events 32 --event-interval-ms 1

Without --events the answer is a small JSON body (a request's head and body read, one write); with it the
answer is an SSE stream of N events written `--event-interval-ms` apart, the shape of the proxy's relay of a
decoder's tokens (the decoder's pace: one event per ms). Each server runs alone on core 0 in its own process
(uvloop, access log off); the client (this process, aiohttp) sends requests one at a time on a keep-alive
connection from core 1, `--gap-ms` apart (0: back to back, a warm path; 2: an idle gap before each, a cold
path). CPU = user + system seconds of the server's processes over the measured requests. Interleaved rounds,
every server once per round; medians and each round's ratio to ours are printed. Every process started here
is stopped by PID.
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

from benchmarks.procs import free_port
from benchmarks.proxy_bench import HARNESS_CORE, PROXY_CORE, ROOT, stop_all, wait_healthy

BODY = b'{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"hi","finish_reason":"length"}]}'
REQUEST = b'{"model":"m","prompt":"hello world","max_tokens":1}'


EVENT = b'data: {"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" hi"}]}\n\n'
# set by the serving process from its command line: events per answer (0: one JSON body) and their spacing
STREAM = {"events": 0, "interval_s": 0.001}


def sse_events() -> list[bytes]:
    return [EVENT] * STREAM["events"] + [b"data: [DONE]\n\n"]


async def pace() -> None:
    await asyncio.sleep(STREAM["interval_s"])


async def aiohttp_answer(request):
    from aiohttp import web

    await request.read()
    if not STREAM["events"]:
        return web.Response(body=BODY, content_type="application/json")
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for event in sse_events():
        await pace()
        await resp.write(event)
    await resp.write_eof()
    return resp


async def serve_aiohttp(port: int) -> None:
    from aiohttp import web

    app = web.Application()
    app.router.add_post("/v1/completions", aiohttp_answer)
    app.router.add_get("/health", aiohttp_answer)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()


async def serve_aiohttp_lowlevel(port: int) -> None:
    from aiohttp import web

    runner = web.ServerRunner(web.Server(aiohttp_answer, access_log=None), handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()


async def serve_ours(port: int) -> None:
    from hybrid_pd.proxy.http.request import Request
    from hybrid_pd.proxy.http.server import HTTPServer

    async def answer(request: Request) -> None:
        if not STREAM["events"]:
            await request.respond(200, BODY)
            return
        request.begin_stream(200, "text/event-stream")
        events = sse_events()
        for event in events[:-1]:
            await pace()
            await request.write(event)
        await pace()
        await request.end_stream(events[-1])

    await HTTPServer.start("127.0.0.1", port, answer)
    await asyncio.Event().wait()


async def asgi_app(scope, receive, send) -> None:
    """A bare ASGI callable (no framework), as uvicorn would run a minimal proxy."""
    if scope["type"] != "http":
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    if not STREAM["events"]:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": BODY})
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    for event in sse_events():
        await pace()
        await send({"type": "http.response.body", "body": event, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


async def serve_uvicorn(port: int) -> None:
    import uvicorn

    config = uvicorn.Config(asgi_app, host="127.0.0.1", port=port, loop="uvloop", http="httptools",
                            lifespan="off", access_log=False, log_level="warning")
    await uvicorn.Server(config).serve()


async def rsgi_app(scope, proto) -> None:
    """A bare RSGI callable for granian."""
    await proto()
    if not STREAM["events"]:
        proto.response_bytes(200, [("content-type", "application/json")], BODY)
        return
    transport = proto.response_stream(200, [("content-type", "text/event-stream")])
    for event in sse_events():
        await pace()
        await transport.send_bytes(event)


def serve_granian(port: int) -> None:
    """Granian runs its own loop and worker process (the CPU counted includes the worker)."""
    from granian.constants import Interfaces, Loops
    from granian.server import Server

    os.environ["HYBRID_PD_BENCH_STREAM"] = f"{STREAM['events']},{STREAM['interval_s']}"
    Server("benchmarks.server_bench:rsgi_app", address="127.0.0.1", port=port, interface=Interfaces.RSGI,
           workers=1, runtime_threads=1, loop=Loops.uvloop, log_access=False).serve()


OURS = "hybrid-pd http_server"
SERVERS = {OURS: serve_ours, "aiohttp web server": serve_aiohttp, "aiohttp low-level Server": serve_aiohttp_lowlevel,
           "uvicorn (httptools + bare ASGI)": serve_uvicorn, "granian (RSGI)": serve_granian}
if os.environ.get("HYBRID_PD_BENCH_STREAM"):  # granian's worker process imports this module afresh
    _events, _interval = os.environ["HYBRID_PD_BENCH_STREAM"].split(",")
    STREAM.update(events=int(_events), interval_s=float(_interval))


def cpu_seconds(proc: psutil.Process) -> float:
    """User + system CPU of a server process and every process under it (granian's worker)."""
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        t = p.cpu_times()
        total += t.user + t.system
    return total


async def cpu_per_request(port: int, proc: psutil.Process, n: int, gap_s: float) -> float:
    url = f"http://127.0.0.1:{port}/v1/completions"
    expected = b"".join(sse_events()) if STREAM["events"] else BODY
    async with aiohttp.ClientSession() as s:
        for _ in range(50):  # warm-up
            async with s.post(url, data=REQUEST, headers={"Content-Type": "application/json"}) as r:
                await r.read()
        start = cpu_seconds(proc)
        for _ in range(n):
            async with s.post(url, data=REQUEST, headers={"Content-Type": "application/json"}) as r:
                if r.status != 200 or await r.read() != expected:
                    raise RuntimeError(f"bad answer from {url}: {r.status}")
            if gap_s:
                await asyncio.sleep(gap_s)
        return (cpu_seconds(proc) - start) / n * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gap-ms", type=float, default=2.0)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--events", type=int, default=0, help="answer with an SSE stream of this many events")
    ap.add_argument("--event-interval-ms", type=float, default=1.0)
    ap.add_argument("--servers", default=",".join(SERVERS), help="comma-separated names (default: all)")
    args = ap.parse_args(argv)
    STREAM.update(events=args.events, interval_s=args.event_interval_ms / 1e3)
    servers = [name for name in SERVERS if name in args.servers.split(",")]
    os.sched_setaffinity(0, {HARNESS_CORE})
    procs: list[subprocess.Popen] = []
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        ports = {}
        for name in servers:
            ports[name] = free_port()
            argv = ["taskset", "-c", str(PROXY_CORE), sys.executable, "-m", "benchmarks.server_bench",
                    "--serve", name, str(ports[name]), str(args.events), str(args.event_interval_ms / 1e3)]
            procs.append(subprocess.Popen(argv, env=env))
        for proc, name in zip(procs, servers):
            wait_healthy(f"http://127.0.0.1:{ports[name]}", proc)
        results: dict[str, list[float]] = {name: [] for name in servers}
        for i in range(args.rounds):
            for proc, name in zip(procs, servers):
                us = uvloop.run(cpu_per_request(ports[name], psutil.Process(proc.pid), args.requests,
                                                args.gap_ms / 1e3))
                results[name].append(us)
                print(f"round {i + 1} {name}: {us:.0f} us CPU per request", flush=True)
    finally:
        stop_all(procs)
    shape = (f"an SSE stream of {args.events} events {args.event_interval_ms:g} ms apart" if args.events
             else "a small JSON body")
    print(f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {args.requests} requests per round, "
          f"{args.gap_ms:g} ms apart, answered with {shape}; median CPU per request (us), and the median of "
          "per-round ratios ours / theirs:")
    ours = results.get(OURS)
    for name, us in results.items():
        ratio = "" if ours is None or name == OURS else \
            f"  ours/this {statistics.median(a / max(b, 1e-9) for a, b in zip(ours, us)):.2f}"
        print(f"  {name:34s} {statistics.median(us):7.0f}{ratio}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--serve":
        STREAM.update(events=int(sys.argv[4]), interval_s=float(sys.argv[5]))
        serve = SERVERS[sys.argv[2]]
        if asyncio.iscoroutinefunction(serve):
            uvloop.run(serve(int(sys.argv[3])))
        else:
            serve(int(sys.argv[3]))
    else:
        sys.exit(main())
