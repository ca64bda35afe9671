"""NIXL READ between two processes on ONE GPU, under the UCX settings the benchmark's workers ran with and the
ones vLLM's NixlConnector guide suggests, next to a device-to-device copy of the same bytes.

Why: in the one-GPU benchmark (benchmarks/results/2026-11-23-h100-*) both connectors moved KV at 0.3-0.4 GB/s, about
1/2500 of a device copy. This separates the transport (UCX over TCP on loopback with host staging, or CUDA IPC)
from the connectors. Needs only torch and the two nixl wheels (no vLLM, no hybrid-pd).

    python3 benchmarks/gpu/nixl_bench.py [--mib 40] [--pieces 1,45]      # runs every variant, prints a table
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time

VARIANTS = {  # name: (environment, progress-thread delay in us)
    "launcher (lo, delay 1000us)": ({"UCX_NET_DEVICES": "lo"}, 1000),
    "launcher, no delay": ({"UCX_NET_DEVICES": "lo"}, 0),
    "no UCX settings": ({}, 0),
    "guide (UCX_NET_DEVICES=all, UCX_TLS=all)": ({"UCX_NET_DEVICES": "all", "UCX_TLS": "all"}, 0),
    "cuda_ipc first (lo)": ({"UCX_NET_DEVICES": "lo", "UCX_TLS": "cuda_ipc,cuda_copy,tcp,self"}, 1000),
    # UCX disables cuda_ipc GET (a NIXL READ) unless it sees NVLink ("cuda-ipc get zcopy disabled as no nvlinks
    # detected", nixl-ucx-debug.txt of the 2026-11-23 run); "on" forces it. Not run yet.
    "cuda_ipc get forced on (lo)": ({"UCX_NET_DEVICES": "lo", "UCX_CUDA_IPC_ENABLE_GET_ZCOPY": "on"}, 1000),
}


def set_delay(delay_us: int) -> None:
    if delay_us <= 0:
        return
    import nixl._api as api

    base = api.nixlBind.nixlAgentConfig

    class Delayed(base):  # same clamp as hybrid_pd.connector.nixl_delay
        def __setattr__(self, name, value):
            super().__setattr__(name, max(int(value), delay_us) if name == "pthrDelay" else value)

    api.nixlBind.nixlAgentConfig = Delayed


def agent(name: str, delay_us: int):
    set_delay(delay_us)
    from nixl._api import nixl_agent, nixl_agent_config

    return nixl_agent(name, nixl_agent_config(backends=["UCX"]))


DEV, MEM = ("cuda", "VRAM") if os.environ.get("NIXL_BENCH_DRAM") != "1" else ("cpu", "DRAM")  # DRAM: logic test


def target(conn, nbytes: int, delay_us: int) -> None:
    import torch

    if DEV == "cuda":
        torch.cuda.set_device(0)
    buf = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=DEV)
    a = agent("target", delay_us)
    a.register_memory(a.get_reg_descs([(buf.data_ptr(), nbytes, 0, "")], MEM))
    conn.send((a.get_agent_metadata(), buf.data_ptr(), int(buf.to(torch.int64).sum())))
    conn.recv()  # the initiator is done


def pair(nbytes: int, pieces: list[int], delay_us: int) -> dict:
    import numpy as np
    import torch

    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=target, args=(there, nbytes, delay_us))
    proc.start()
    meta, remote, checksum = here.recv()
    if DEV == "cuda":
        torch.cuda.set_device(0)
    dst = torch.zeros(nbytes, dtype=torch.uint8, device=DEV)
    a = agent("initiator", delay_us)
    a.register_memory(a.get_reg_descs([(dst.data_ptr(), nbytes, 0, "")], MEM))
    peer = a.add_remote_agent(meta)
    peer = peer.decode() if isinstance(peer, bytes) else peer
    out = {}
    for k in pieces:
        cut = nbytes // k
        loc = a.get_xfer_descs(np.array([(dst.data_ptr() + i * cut, cut, 0) for i in range(k)], dtype=np.uint64), MEM)
        rem = a.get_xfer_descs(np.array([(remote + i * cut, cut, 0) for i in range(k)], dtype=np.uint64), MEM)
        times = []
        for rep in range(6):
            dst.zero_()
            torch.cuda.synchronize() if DEV == "cuda" else None
            h = a.initialize_xfer("READ", loc, rem, peer)
            t = time.perf_counter()
            state = a.transfer(h)
            while state not in ("DONE", "ERR"):
                state = a.check_xfer_state(h)
            dt = time.perf_counter() - t
            a.release_xfer_handle(h)
            if state == "ERR":
                raise RuntimeError("READ failed")
            if rep:  # the first READ sets up the connection
                times.append(dt)
        ok = int(dst.to(torch.int64).sum()) == checksum if k == 1 else None
        med = statistics.median(times)
        out[k] = {"median_s": med, "gb_s": nbytes / med / 1e9, "first_rep_excluded": True, "checksum_ok": ok}
    here.send("done")
    proc.join(30)
    return out


def device_copy(nbytes: int) -> float:
    import torch

    if DEV != "cuda":
        return float("nan")
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return nbytes / statistics.median(times) / 1e9


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=float, default=40)
    ap.add_argument("--pieces", default="1,45")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one variant in this process
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    nbytes = int(args.mib * 2 ** 20)
    pieces = [int(p) for p in args.pieces.split(",")]
    if args.one:
        env, delay = VARIANTS[args.one]
        print("RESULT " + json.dumps(pair(nbytes, pieces, delay)), flush=True)
        return 0
    rows = {"device_copy_gb_s": device_copy(nbytes), "bytes": nbytes, "variants": {}}
    for name, (env, _delay) in VARIANTS.items():
        full = {k: v for k, v in os.environ.items() if not k.startswith("UCX_")} | env
        try:
            argv = [sys.executable, __file__, "--mib", str(args.mib), "--pieces", args.pieces, "--one", name]
            p = subprocess.run(argv,
                               env=full, capture_output=True, text=True, timeout=90)
            line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
            rows["variants"][name] = json.loads(line[7:]) if line else {"error": (p.stdout + p.stderr)[-1500:]}
        except subprocess.TimeoutExpired:
            rows["variants"][name] = {"error": "timeout after 90 s"}
        print(name, json.dumps(rows["variants"][name])[:600], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    print(f"device copy {rows['device_copy_gb_s']:.0f} GB/s for {nbytes} bytes")
    for name, r in rows["variants"].items():
        cells = [f"{k} desc: {v['gb_s']:.2f} GB/s ({v['median_s'] * 1e3:.2f} ms)" for k, v in r.items()
                 if isinstance(v, dict) and "gb_s" in v] or [str(r)[:200]]
        print(f"{name:45s} " + "; ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
