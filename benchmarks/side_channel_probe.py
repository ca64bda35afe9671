"""One prefiller and one decoder on chosen cores, our connector, PD requests one at a time (P, then D with P's
kv_transfer_params): per request P's time, D's time, and D's handshake / load log lines. The failing shared-core layout
is the default: P on core 0, D on cores 0-1 (there every load failed its handshake, 10 of 10, D waiting 25 s each).

    bash deploy/dev.sh run python -m benchmarks.side_channel_probe [--p-cores 0] [--d-cores 0-1] [--requests 4]

While it runs, `ss -ltnp` shows P's side channel (backlog 100) and its accept queue (Recv-Q), and
/proc/<P worker>/task/*/sched each thread's switches: see benchmarks/results/2026-11-24-cpu-burst/summary.md.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from benchmarks.setups import CpuBed, Workers
from hybrid_pd.prefill.dev.tiny_model import TinyModelSpec, build_tiny_model
from tests.support.conversation import complete, text_of


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--p-cores", default="0")
    ap.add_argument("--d-cores", default="0-1")
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--logs", type=Path, default=None)
    a = ap.parse_args()
    logs = a.logs or Path(tempfile.mkdtemp(prefix="side-channel-probe-"))
    logs.mkdir(parents=True, exist_ok=True)
    model = str(build_tiny_model(TinyModelSpec()))
    workers = Workers(CpuBed(model, prefill_core=a.p_cores, decode_core=a.d_cores), logs)
    p = workers.start("p", "prefill", "hybrid")
    d = workers.start("d", "decode", "hybrid")
    try:
        workers.ready(p, 300)
        workers.ready(d, 300)
        print(f"P cores {a.p_cores}, D cores {a.d_cores}; logs in {logs}", flush=True)
        seen = 0
        for i in range(a.requests):
            prompt = text_of(300, 100 + i)
            t0 = time.monotonic()
            pr = complete(p.url, prompt, max_tokens=1, kv_transfer_params={"do_remote_decode": True})
            t1 = time.monotonic()
            complete(d.url, prompt, max_tokens=4, kv_transfer_params=pr["kv_transfer_params"])
            t2 = time.monotonic()
            text = d.log_path.read_text()
            lines = [ln[-120:] for ln in text[seen:].splitlines() if "handshake" in ln or "hybrid-pd load" in ln]
            seen = len(text)
            took = f"P {1e3 * (t1 - t0):.0f} ms, D {1e3 * (t2 - t1):.0f} ms"
            print(f"request {i}: {took}; {' | '.join(lines)}", flush=True)
            time.sleep(0.5)
    finally:
        workers.close()


if __name__ == "__main__":
    main()
