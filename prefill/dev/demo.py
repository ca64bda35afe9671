"""`hybrid-pd demo`: the whole system on its embedded default, on 127.0.0.1, then stopped.

Builds (or finds) the tiny hybrid model, starts one prefill worker, one decode worker and the proxy through
the same launchers a user runs, sends a completion and a multi-turn chat through the proxy, prints the
answers, TTFT/ITL, the cache hits and what the decoder pulled over NIXL, and stops every process it started.
With `--reference`, a third, colocated engine answers the same requests and the report says whether PD's
greedy output equals it. The GPU integration script (deploy/gpu/) runs this same code with `--device gpu`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

from hybrid_pd.prefill.dev.demo_workload import format_report, run_workload
from hybrid_pd.prefill.dev.tiny_model import CACHE_ROOT
from hybrid_pd.prefill.launch.supervisor import ChildProcess

HYBRID_PD = [sys.executable, "-m", "hybrid_pd.prefill.launch.command"]  # works where console scripts were not installed


class PeakMemory:
    """Samples the summed RSS of our process tree (launchers, vLLM servers, engine cores, proxy)."""

    def __init__(self, interval: float = 0.5):
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)

    def _run(self, interval: float) -> None:
        import psutil

        me = psutil.Process()
        while not self._stop.wait(interval):
            total = 0
            for p in [me, *me.children(recursive=True)]:
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    pass
            self.peak = max(self.peak, total)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="hybrid-pd demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--connector", default="hybrid", choices=["hybrid", "upstream"])
    ap.add_argument("--model", default="tiny", help="model for every worker ('tiny': the built-in one)")
    ap.add_argument("--device", choices=["cpu", "gpu"], default=None, help="default: what vLLM is built for")
    ap.add_argument("--prefill-gpu", default="0", help="CUDA_VISIBLE_DEVICES of the prefill worker")
    ap.add_argument("--decode-gpu", default="1", help="CUDA_VISIBLE_DEVICES of the decode worker (and reference)")
    ap.add_argument("--gpu-memory-utilization", default="0.4")
    ap.add_argument("--reference", action="store_true", help="also run a colocated engine and compare outputs")
    ap.add_argument(
        "--pd-policy",
        default="always-remote",
        help="the proxy's --pd-policy. The demo shows the PD flow, so every turn goes through the prefiller; 'ours' "
        "places each turn by its predicted TTFT, which on the demo's idle decoder keeps every turn there",
    )
    ap.add_argument("--base-port", type=int, default=18000, help="proxy port; workers use the next ones")
    ap.add_argument("--logs", type=Path, default=CACHE_ROOT / "demo-logs")
    ap.add_argument("--report", type=Path, default=None, help="write the report as JSON here")
    ap.add_argument("--startup-timeout", type=float, default=900)
    ap.add_argument("vllm_args", nargs=argparse.REMAINDER, help="-- then extra vLLM flags for every worker")
    return ap.parse_args(argv)


def build_children(args: argparse.Namespace) -> list[ChildProcess]:
    port = args.base_port
    common = ["--model", args.model, "--max-model-len", "2048", "--max-num-seqs", "4"]
    if args.device:
        common += ["--device", args.device]
    if args.device == "gpu":
        common += ["--gpu-memory-utilization", args.gpu_memory_utilization]
    extra = args.vllm_args[1:] if args.vllm_args[:1] == ["--"] else args.vllm_args
    tail = ["--", *extra] if extra else []

    def worker(name: str, role: str, offset: int, connector: str, core: str, gpu: str) -> ChildProcess:
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpu) if args.device == "gpu" else None
        argv = [
            *HYBRID_PD,
            role,
            "--connector",
            connector,
            "--port",
            str(port + offset),
            "--side-channel-port",
            str(port + 10 + offset),
            "--kv-events-port",
            str(port + 20 + offset),
            "--cpu-bind",
            core,
            *common,
            *tail,
        ]
        return ChildProcess(
            name, argv, f"http://127.0.0.1:{port + offset}", env=env, log=open(args.logs / f"{name}.log", "w")
        )

    children = [
        worker("prefill", "prefill", 1, args.connector, "0", args.prefill_gpu),
        worker("decode", "decode", 2, args.connector, "1", args.decode_gpu),
    ]
    if args.reference:
        children.append(worker("reference", "decode", 3, "none", "1", args.decode_gpu))
    children.append(
        ChildProcess(
            "proxy",
            [
                *HYBRID_PD,
                "proxy",
                "--port",
                str(port),
                "--prefill",
                children[0].url,
                "--decode",
                children[1].url,
                "--prefill-events",
                f"tcp://127.0.0.1:{port + 21}",
                "--decode-events",
                f"tcp://127.0.0.1:{port + 22}",
                "--pd-policy",
                args.pd_policy,
                "--drain-delay-s",
                "0",
            ],  # no load balancer to tell: stop at once
            f"http://127.0.0.1:{port}",
            log=open(args.logs / "proxy.log", "w"),  # noqa: SIM115 (the child writes it)
        )
    )
    return children


def start_waves(workers: list[ChildProcess], args: argparse.Namespace) -> list[list[ChildProcess]]:
    """Workers that share a GPU start one after the other: vLLM sizes its KV cache from the memory it sees
    used while profiling, and counts a neighbour's allocations made meanwhile as its own (on vLLM 0.26 the
    decoder then found -0.45 GiB for its cache next to the reference engine). CPU workers start together."""
    if args.device != "gpu":
        return [workers]
    waves: list[list[ChildProcess]] = []
    seen: dict[str, int] = {}
    for worker in workers:
        gpu = worker.env["CUDA_VISIBLE_DEVICES"]
        wave = seen[gpu] = seen.get(gpu, -1) + 1
        if wave == len(waves):
            waves.append([])
        waves[wave].append(worker)
    return waves


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.logs.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    if args.model == "tiny":
        from hybrid_pd.prefill.dev.tiny_model import build_tiny_model

        print(f"[demo] tiny hybrid model: {build_tiny_model()}", flush=True)
    children = build_children(args)
    by_name = {c.name: c for c in children}
    served = "hybrid-pd-tiny" if args.model == "tiny" else args.model
    try:
        with PeakMemory() as mem:
            # Workers first (they load in parallel), the proxy once they answer, so it starts with all healthy.
            for group in [*start_waves(children[:-1], args), children[-1:]]:
                for child in group:
                    child.start()
                for child in group:
                    took = child.wait_healthy(args.startup_timeout)
                    print(f"[demo] {child.name} healthy at {child.url} (pid {child.pid}) after {took:.0f}s", flush=True)
            ref = by_name["reference"].url if args.reference else None
            report = run_workload(by_name["proxy"].url, by_name["decode"].url, served, ref)
        report |= {
            "connector": args.connector,
            "device": args.device or "default",
            "model": args.model,
            "peak_rss_gib": round(mem.peak / 2**30, 2),
            "wall_s": round(time.monotonic() - t0, 1),
        }
        print(format_report(report))
        print(f"[demo] peak memory of all processes: {report['peak_rss_gib']} GiB; wall {report['wall_s']}s")
        if args.report:
            args.report.write_text(json.dumps(report, indent=1))
        ok = report["transfer"]["bytes"] > 0 and all(
            r["matches_reference"] is not False and r["completion_tokens"] > 0 for r in report["requests"]
        )
        return 0 if ok else 1
    except Exception as e:  # noqa: BLE001  (top of the demo: say what broke and where the logs are)
        print(f"[demo] FAILED: {e}\n[demo] logs: {args.logs}", file=sys.stderr)
        return 1
    finally:
        for child in reversed(children):
            child.stop(group=False)  # the launchers forward SIGTERM to vLLM and wait for it
        print("[demo] stopped all processes", flush=True)


if __name__ == "__main__":
    sys.exit(main())
