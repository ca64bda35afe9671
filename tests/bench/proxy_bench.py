"""Proxy overhead benchmark: the PD flow through our proxy vs vLLM's toy proxy design, on fake workers.

    python -m tests.bench.proxy_bench [--requests 400] [--concurrency 16] [--tokens 32] [--out FILE.md]

vllm-router cannot be installed here (no new dependencies), so the comparison point is the design of vLLM's
examples/.../disagg_proxy `toy_proxy_server.py` (FastAPI + httpx, P then D, no routing state), rebuilt below
with the same flow. Fake workers (tests/proxy/fakes.py) answer at once, so what is measured is the proxies
themselves: added time to first token, end-to-end latency and requests/s at a fixed concurrency. Each piece
runs in its own process on 127.0.0.1; the numbers are noisy on a shared 2-core machine: compare runs side by
side, not across machines. `direct` streams from the fake decoder alone (no prefill call): the floor.
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
from pathlib import Path

import aiohttp

from tests.support.procs import free_port

PY = sys.executable

WORKERS = textwrap.dedent("""
    import asyncio, sys
    from tests.proxy.fakes import FakeWorker
    async def main(p_port, d_port, tokens):
        from aiohttp import web
        ws = [FakeWorker("prefill"), FakeWorker("decode")]
        ws[1].chunks = tuple(f" t{i}" for i in range(tokens))
        for w, port in zip(ws, (p_port, d_port)):
            app = web.Application()
            for path, h in (("/v1/completions", w._generate), ("/health", w._health)):
                (app.router.add_post if path.startswith("/v1") else app.router.add_get)(path, h)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            w.url = f"http://127.0.0.1:{port}"
            w.seen = _Discard()
        await asyncio.Event().wait()
    class _Discard(list):
        def append(self, item):
            pass
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])))
""")

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


def wait_healthy(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} not healthy after {timeout}s")


async def load(url: str, n: int, concurrency: int, tokens: int) -> dict:
    body = {"model": "m", "prompt": "hello world " * 50, "max_tokens": tokens, "stream": True}
    ttft: list[float] = []
    e2e: list[float] = []
    queue = list(range(2 * concurrency))  # warm-up requests: connections and code paths

    async def one(s: aiohttp.ClientSession) -> None:
        while queue:
            queue.pop()
            t0 = time.perf_counter()
            first = None
            async with s.post(url + "/v1/completions", json=body) as r:
                assert r.status == 200, await r.text()
                async for line in r.content:
                    if first is None and line.startswith(b"data: {"):
                        first = time.perf_counter() - t0
            ttft.append(first or 0.0)
            e2e.append(time.perf_counter() - t0)

    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as s:
        await asyncio.gather(*(one(s) for _ in range(concurrency)))
        ttft.clear()
        e2e.clear()
        queue.extend(range(n))
        t = time.perf_counter()
        await asyncio.gather(*(one(s) for _ in range(concurrency)))
        wall = time.perf_counter() - t

    def pct(xs: list[float], q: float) -> float:
        return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))] * 1e3
    return {"rps": n / wall, "ttft_p50": pct(ttft, 0.5), "ttft_p99": pct(ttft, 0.99),
            "e2e_p50": pct(e2e, 0.5), "e2e_p99": pct(e2e, 0.99), "e2e_mean": statistics.mean(e2e) * 1e3}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    p_port, d_port, ours_port, toy_port = (free_port() for _ in range(4))
    p_url, d_url = f"http://127.0.0.1:{p_port}", f"http://127.0.0.1:{d_port}"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "P_URL": p_url, "D_URL": d_url}
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory() as tmp:
        toy = Path(tmp) / "toy_proxy.py"
        toy.write_text(TOY_PROXY)
        try:
            procs.append(subprocess.Popen([PY, "-c", WORKERS, str(p_port), str(d_port), str(args.tokens)], env=env))
            procs.append(subprocess.Popen([PY, "-m", "hybrid_pd.proxy.server", "--port", str(ours_port),
                                           "--prefill", p_url, "--decode", d_url, "--log-level", "WARNING",
                                           "--health-interval", "0"], env=env, stdout=subprocess.DEVNULL))
            procs.append(subprocess.Popen([PY, "-m", "uvicorn", "--app-dir", tmp, "toy_proxy:app", "--port",
                                           str(toy_port), "--host", "127.0.0.1", "--log-level", "warning",
                                           "--no-access-log"], env=env))
            for url in (p_url, d_url, f"http://127.0.0.1:{ours_port}", f"http://127.0.0.1:{toy_port}"):
                wait_healthy(url)
            rows = {}
            setups = (("direct (D only, no prefill)", d_url), ("hybrid-pd proxy", f"http://127.0.0.1:{ours_port}"),
                      ("toy proxy (FastAPI+httpx)", f"http://127.0.0.1:{toy_port}"))
            for name, url in setups:
                rows[name] = asyncio.run(load(url, args.requests, args.concurrency, args.tokens))
                print(name, {k: round(v, 2) for k, v in rows[name].items()}, flush=True)
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
    report = [f"# Proxy overhead: hybrid-pd proxy vs a vLLM toy-proxy design (fake workers)\n",
              f"Command: `python -m tests.bench.proxy_bench --requests {args.requests} --concurrency "
              f"{args.concurrency} --tokens {args.tokens}`  ",
              f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
              f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. Streaming completions, {args.tokens} SSE "
              "chunks each; fake workers answer at once.\n",
              "| set-up | req/s | TTFT p50 ms | TTFT p99 ms | e2e p50 ms | e2e p99 ms |", "|---|---|---|---|---|---|"]
    for name, r in rows.items():
        report.append(f"| {name} | {r['rps']:.0f} | {r['ttft_p50']:.1f} | {r['ttft_p99']:.1f} | {r['e2e_p50']:.1f} "
                      f"| {r['e2e_p99']:.1f} |")
    text = "\n".join(report) + "\n"
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
