"""`hybrid-pd demo`: the whole system on its embedded default, on 127.0.0.1, then stopped.

Builds (or finds) the tiny hybrid model, starts one prefill worker, one decode worker and the proxy through
the same launchers a user runs, sends a chat request and a completion through the proxy, prints the answers,
the cache hits and what the decoder pulled over NIXL, and stops every process it started by PID.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import urllib.request
from pathlib import Path

from hybrid_pd.prefill.supervisor import ChildProcess
from hybrid_pd.prefill.tiny_model import CACHE_ROOT

BIN = Path(sys.executable).parent
TRANSFER_METRICS = {  # what the decoder's connector reports (vLLM's NIXL metrics), summed over labels
    "bytes": "vllm:nixl_bytes_transferred_sum",
    "descriptors": "vllm:nixl_num_descriptors_sum",
    "transfers": "vllm:nixl_xfer_time_seconds_count",
    "transfer_seconds": "vllm:nixl_xfer_time_seconds_sum",
    "failed_transfers": "vllm:nixl_num_failed_transfers_total",
}
QUESTION = ("You are a helpful agent. The quick brown fox jumps over the lazy dog; the prefix cache keeps "
            "the mamba state of every attention block. " * 12 + "Which engine decodes this request?")


def post(url: str, body: dict, timeout: float = 300) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def transfer_metrics(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        lines = [ln for ln in r.read().decode().splitlines() if ln and not ln.startswith("#")]
    out = {}
    for key, name in TRANSFER_METRICS.items():
        out[key] = sum(float(ln.rpartition(" ")[2]) for ln in lines
                       if ln.split("{")[0].split(" ")[0] == name)
    return out


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

    def __enter__(self) -> "PeakMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)


def usage_line(resp: dict) -> str:
    u = resp.get("usage") or {}
    cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return f"prompt {u.get('prompt_tokens')} tokens ({cached} from cache), completion {u.get('completion_tokens')}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="hybrid-pd demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--connector", default="upstream", choices=["hybrid", "upstream"])
    ap.add_argument("--base-port", type=int, default=18000, help="proxy port; workers use the next ones")
    ap.add_argument("--logs", type=Path, default=CACHE_ROOT / "demo-logs")
    ap.add_argument("--startup-timeout", type=float, default=900)
    args = ap.parse_args(argv)
    args.logs.mkdir(parents=True, exist_ok=True)
    hp = str(BIN / "hybrid-pd")
    port = args.base_port
    worker_flags = ["--connector", args.connector, "--max-model-len", "2048", "--max-num-seqs", "4"]
    children = [
        ChildProcess("prefill", [hp, "prefill", "--port", str(port + 1), "--side-channel-port", str(port + 11),
                                 "--kv-events-port", str(port + 21), "--cpu-bind", "0", *worker_flags],
                     f"http://127.0.0.1:{port + 1}", log=open(args.logs / "prefill.log", "w")),
        ChildProcess("decode", [hp, "decode", "--port", str(port + 2), "--side-channel-port", str(port + 12),
                                "--kv-events-port", str(port + 22), "--cpu-bind", "1", *worker_flags],
                     f"http://127.0.0.1:{port + 2}", log=open(args.logs / "decode.log", "w")),
        ChildProcess("proxy", [hp, "proxy", "--port", str(port), "--prefill", f"http://127.0.0.1:{port + 1}",
                               "--decode", f"http://127.0.0.1:{port + 2}",
                               "--prefill-events", f"tcp://127.0.0.1:{port + 21}",
                               "--decode-events", f"tcp://127.0.0.1:{port + 22}"],
                     f"http://127.0.0.1:{port}", log=open(args.logs / "proxy.log", "w")),
    ]
    from hybrid_pd.prefill.tiny_model import build_tiny_model

    t0 = time.monotonic()
    print(f"[demo] tiny hybrid model: {build_tiny_model()}", flush=True)
    try:
        with PeakMemory() as mem:
            for child in children:
                child.start()
            for child in children:
                took = child.wait_healthy(args.startup_timeout)
                print(f"[demo] {child.name} healthy at {child.url} (pid {child.pid}) after {took:.0f}s", flush=True)
            proxy, decode = children[2].url, children[1].url
            before = transfer_metrics(decode)
            chat = post(proxy + "/v1/chat/completions", {
                "model": "hybrid-pd-tiny", "max_tokens": 16, "temperature": 0,
                "messages": [{"role": "user", "content": QUESTION}]})
            print(f"[demo] chat answer: {chat['choices'][0]['message']['content']!r}\n       {usage_line(chat)}")
            comp = post(proxy + "/v1/completions", {
                "model": "hybrid-pd-tiny", "max_tokens": 16, "temperature": 0, "prompt": QUESTION})
            print(f"[demo] completion: {comp['choices'][0]['text']!r}\n       {usage_line(comp)}")
            after = transfer_metrics(decode)
            moved = {k: after[k] - before[k] for k in after}
            print(f"[demo] transferred P->D over NIXL ({args.connector} connector): {moved['bytes']:.0f} bytes in "
                  f"{moved['transfers']:.0f} transfers, {moved['descriptors']:.0f} descriptors, "
                  f"{moved['transfer_seconds'] * 1e3:.1f} ms, {moved['failed_transfers']:.0f} failed", flush=True)
        print(f"[demo] peak memory of all processes: {mem.peak / 2**30:.2f} GiB; wall {time.monotonic() - t0:.0f}s")
        return 0 if moved["bytes"] > 0 else 1
    except Exception as e:  # noqa: BLE001  (top of the demo: say what broke and where the logs are)
        print(f"[demo] FAILED: {e}\n[demo] logs: {args.logs}", file=sys.stderr)
        return 1
    finally:
        for child in reversed(children):
            child.stop(group=False)  # the launchers forward SIGTERM to vLLM and wait for it
        print("[demo] stopped all processes", flush=True)


if __name__ == "__main__":
    sys.exit(main())
