"""CPU per request of our proxy against a peer, in interleaved phases: an A/B of a proxy change on a busy machine.

    python -m benchmarks.proxy_ab --baseline REV [--baseline-dir DIR] [--router] [--no-stream] [--token-interval-ms 1]
                                  [--concurrency 1] [--phase-s 1] [--phases 10] [--rounds 3]

proxy_bench.py measures each peer for seconds at a time, one after the other: on a machine shared with other
work, the load around one peer's turn is not the load around the next one's, and a few percent of difference
drowns in that. Here the peers (ours, ours as of --baseline REV, vllm-router with --router, the floor of a
Python proxy on uvicorn with --floor: benchmarks/proxy_floor.py) take turns in phases of --phase-s seconds
(closed-loop clients, --concurrency of them, as in proxy_bench), --phases turns each per round, so that all see
the same machine within seconds. Each round reports CPU ms per request (user + system of the proxy's process
tree, over all of its phases), the ratio of ours to each peer in the round, and each peer's median end-to-end
latency in the round. The set-up is proxy_bench's (fake workers on core 1, every proxy on core 0, same flags).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import psutil
import uvloop

from benchmarks import proxy_bench as pb


async def phase(s: aiohttp.ClientSession, url: str, concurrency: int, seconds: float, tokens: int) -> list[float]:
    """End-to-end seconds of the requests `concurrency` closed-loop clients completed in about `seconds` (the
    last ones finish)."""
    took: list[float] = []
    until = time.perf_counter() + seconds

    async def client() -> None:
        while time.perf_counter() < until:
            took.append(await pb.one_request(s, url, tokens))

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return took


Round = dict[str, tuple[float, list[float]]]  # per peer: CPU seconds, end-to-end seconds of each request


async def one_round(peers: list[pb.Peer], args: argparse.Namespace) -> Round:
    cpu = {p.name: 0.0 for p in peers}
    took: dict[str, list[float]] = {p.name: [] for p in peers}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        for p in peers:  # warm-up: connections, code paths
            await phase(s, p.url, args.concurrency, 0.3, args.tokens)
        for _ in range(args.phases):
            for p in peers:
                cpu0 = p.cpu_s()
                took[p.name] += await phase(s, p.url, args.concurrency, args.phase_s, args.tokens)
                cpu[p.name] += p.cpu_s() - cpu0
    return {name: (cpu[name], took[name]) for name in cpu}


def cpu_ms(r: Round, name: str) -> float:
    return 1e3 * r[name][0] / max(len(r[name][1]), 1)


def p50_ms(r: Round, name: str) -> float:
    return 1e3 * statistics.median(r[name][1])


def start_floor(ours: pb.Peer, procs: list) -> pb.Peer:
    """benchmarks/proxy_floor.py on the proxies' core, in front of the workers ours was given."""
    assert ours.proc is not None
    argv = ours.proc.cmdline()
    workers = {flag: argv[argv.index(flag) + 1] for flag in ("--prefill", "--decode")}
    port = pb.free_port()
    procs.append(
        subprocess.Popen(
            [
                "taskset",
                "-c",
                str(pb.PROXY_CORE),
                pb.PY,
                "-m",
                "benchmarks.proxy_floor",
                "--port",
                str(port),
                "--prefill",
                workers["--prefill"],
                "--decode",
                workers["--decode"],
            ],
            env={**os.environ, "PYTHONPATH": str(pb.ROOT)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    )
    url = f"http://127.0.0.1:{port}"
    pb.wait_healthy(url, procs[-1])
    return pb.Peer("floor: uvicorn + our client", url, psutil.Process(procs[-1].pid))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", default="", metavar="REV", help="our proxy as of this git revision")
    ap.add_argument("--baseline-dir", type=Path, default=None, metavar="DIR",
                    help="our proxy as installed in DIR (e.g. the mypyc build: pip install --target DIR)")
    ap.add_argument("--router", action="store_true", help="vllm-router as a peer too")
    ap.add_argument("--no-stream", action="store_true")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--token-interval-ms", type=float, default=0.0)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--phase-s", type=float, default=1.0)
    ap.add_argument("--phases", type=int, default=10, help="turns of each peer per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--floor",
        action="store_true",
        help="benchmarks/proxy_floor.py as a peer too: uvicorn + our client, none of the proxy's work",
    )
    ap.add_argument("--router-venv", type=Path, default=pb.DEFAULT_ROUTER_VENV)
    ap.add_argument("--prompt-ids", type=int, default=0,
                    help="N: the prompt as N token ids (a real shape's 8k turn: 9000), not 50 words of text")
    args = ap.parse_args(argv)
    if not args.baseline and not args.baseline_dir and not args.router and not args.floor:
        raise SystemExit("name a peer: --baseline REV, --baseline-dir DIR, --router, --floor")
    args.no_router = not args.router
    pb.BODY["max_tokens"] = args.tokens
    pb.BODY["stream"] = not args.no_stream
    if args.prompt_ids:
        pb.BODY["prompt"] = [10 + i * 7919 % 150000 for i in range(args.prompt_ids)]
    os.sched_setaffinity(0, {pb.HARNESS_CORE})
    procs: list = []
    rounds: list[Round] = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            peers = [p for p in pb.start_all(args, tmp, procs) if p.proc is not None and not p.name.startswith("toy")]
            if args.floor:
                peers.append(start_floor(peers[0], procs))
            for i in range(args.rounds):
                rounds.append(uvloop.run(one_round(peers, args)))
                print(f"round {i + 1}: " + "; ".join(
                    f"{p.name} {cpu_ms(rounds[-1], p.name):.4f} ms x {len(rounds[-1][p.name][1])}, "
                    f"e2e p50 {p50_ms(rounds[-1], p.name):.3f} ms" for p in peers), flush=True)
        finally:
            pb.stop_all(procs)
    ours = peers[0].name
    cell = (f"{'not streamed' if args.no_stream else 'streamed'}, {args.token_interval_ms:g} ms between events, "
            f"prompt {args.prompt_ids or 'of 50 words'}{' token ids' if args.prompt_ids else ''}, "
            f"c={args.concurrency}, {args.phases} phases of {args.phase_s:g} s per peer per round")
    print(f"\n{cell}\n\n| peer | CPU ms/req (median of rounds) | per round | {ours} / peer per round | median | "
          "e2e p50 ms per round |")
    print("|---|---|---|---|---|---|")
    for p in peers:
        per = [cpu_ms(r, p.name) for r in rounds]
        ratios = [cpu_ms(r, ours) / cpu_ms(r, p.name) for r in rounds]
        print(f"| {p.name} | {statistics.median(per):.4f} | {', '.join(f'{x:.4f}' for x in per)} | "
              f"{', '.join(f'{x:.3f}' for x in ratios)} | {statistics.median(ratios):.3f} | "
              f"{', '.join(f'{p50_ms(r, p.name):.2f}' for r in rounds)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
