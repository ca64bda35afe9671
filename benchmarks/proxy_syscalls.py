"""Syscalls of one proxy at concurrency 1 (strace -c on it alone), to tell the kernel's share from the runtime's.

    /root/.cache/hybrid-pd/venv/bin/python -m benchmarks.proxy_syscalls ours|router INTERVAL_MS REQUESTS
    /root/.cache/hybrid-pd/venv/bin/python -m benchmarks.proxy_syscalls relay      # our Python per relayed event

Starts the fake workers (events INTERVAL_MS apart) and the proxy (ours, or vllm-router from the proxy bench's
venv), warms up with 20 requests, then counts the proxy's syscalls over REQUESTS streamed completions; the table
goes to /tmp/strace_<peer>_<interval>.txt. Needs strace. Every process it starts is stopped by PID.
`relay` times the proxy's code for one SSE event (D's connection callback, the relaying task's wake-up, the
server's send, with transports that drop the bytes): ours and the event loop's, without the kernel's.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import uvloop

from benchmarks import proxy_bench as pb
from benchmarks.procs import free_port
from benchmarks.proxy_bench import DEFAULT_ROUTER_VENV, ROOT
from hybrid_pd.proxy import relay
from hybrid_pd.proxy.http import client
from hybrid_pd.proxy.http.request import Request
from hybrid_pd.proxy.http.response import Response

PY = sys.executable


def main(which: str, interval: str, n: int) -> None:
    p, d, o, m = free_port(), free_port(), free_port(), free_port()
    pu, du = f"http://127.0.0.1:{p}", f"http://127.0.0.1:{d}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([PY, "-m", "benchmarks.proxy_fake_workers", str(p), str(d), "32", interval], env=env)]
    if which == "ours":
        argv = [PY, "-m", "hybrid_pd.proxy.server", "--port", str(o), "--prefill", pu, "--decode", du,
                "--log-level", "WARNING"]
    else:
        argv = [str(DEFAULT_ROUTER_VENV / "bin" / "vllm-router"), "--vllm-pd-disaggregation",
                "--prefill", pu, "--decode", du,
                "--host", "127.0.0.1", "--port", str(o), "--prometheus-host", "127.0.0.1", "--prometheus-port", str(m),
                "--policy", "round_robin", "--log-level", "warning"]
    procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    url = f"http://127.0.0.1:{o}"
    try:
        pb.wait_healthy(pu, procs[0])
        pb.wait_healthy(url, procs[1])
        uvloop.run(pb.latency_c1(url, 20, 32, 10, lambda: 0.0))
        st = subprocess.Popen(["strace", "-c", "-f", "-p", str(procs[1].pid),
                               "-o", f"/tmp/strace_{which}_{interval}.txt"])
        time.sleep(1)
        lat, _ = uvloop.run(pb.latency_c1(url, n, 32, 60, lambda: 0.0))
        st.terminate()
        st.wait()
        print(f"{which}: {len(lat)} requests traced, table in /tmp/strace_{which}_{interval}.txt")
    finally:
        pb.stop_all(procs)


class _NullTransport:
    def write(self, data: bytes) -> None:
        pass

    def is_closing(self) -> bool:
        return False


async def relay_cost_per_event(n: int = 100_000) -> float:
    """Microseconds of CPU per event through client._Connection.data_received -> relay_sse -> the server's send
    (here one that drops the bytes), the relaying task's wake-up per event included."""
    event = (b'data: {"id":"cmpl-fake","object":"text_completion","created":0,"model":"fake-model","choices":'
             b'[{"index":0,"text":" t1","logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n')
    chunk = b"%x\r\n%b\r\n" % (len(event), event)
    loop = asyncio.get_running_loop()
    conn = client._Connection(None, ("http", "x", 1), loop)  # type: ignore[arg-type]
    conn.transport = _NullTransport()  # type: ignore[assignment]
    conn._mode = client._CHUNKED
    conn._resp = resp = Response(conn, 200, {"content-type": "text/event-stream"})

    async def send(message: dict) -> None:
        pass

    request = Request(send, "POST", "/v1/completions", "", "1.1", {}, b"")
    conn.data_received(chunk)
    task = loop.create_task(relay.relay_sse(request, resp, lambda chunk: None, worker="d", first_byte_timeout=5.0,
                                            deadline=loop.time() + 3600, loop=loop, on_first_byte=lambda: None))
    await asyncio.sleep(0)
    t = time.process_time()
    for _ in range(n):
        conn.data_received(chunk)
        await asyncio.sleep(0)
    cost = (time.process_time() - t) / n * 1e6
    task.cancel()
    return cost


if __name__ == "__main__":
    if sys.argv[1] == "relay":
        print(f"{asyncio.run(relay_cost_per_event()):.2f} us of CPU per relayed event")
    else:
        main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
