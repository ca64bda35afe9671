"""The proxy's graceful stop, on real processes: `hybrid-pd proxy` in front of the benchmark's fake workers
(benchmarks/proxy_fake_workers.py: every decode answer is an SSE stream of N events, one per interval).

SIGTERM: /health 503 at once, new requests served for --drain-delay-s, then connections refused, open streams
finish (up to --drain-timeout-s, then cut with an SSE error event), exit 0. A second signal stops at once.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import aiohttp

from tests.support.procs import free_port

PROXY = [sys.executable, "-m", "hybrid_pd.prefill.launch.command", "proxy"]
BODY = {"prompt": "hello", "max_tokens": 8, "stream": True}


@contextmanager
def fleet(tokens: int, interval_ms: int, *proxy_flags: str) -> Iterator[tuple[subprocess.Popen, str]]:
    """Fake workers and a proxy in front of them (decode only); yields (proxy process, proxy URL)."""
    p_port, d_port = free_port(), free_port()
    workers = subprocess.Popen([sys.executable, "-m", "benchmarks.proxy_fake_workers", str(p_port), str(d_port),
                                str(tokens), str(interval_ms)])
    proxy = None
    try:
        wait_listening(d_port)
        proxy = subprocess.Popen([*PROXY, "--port", "0", "--decode", f"http://127.0.0.1:{d_port}",
                                  "--health-interval", "0", "--log-level", "WARNING", *proxy_flags],
                                 stdout=subprocess.PIPE, text=True)
        line = proxy.stdout.readline()
        assert line.startswith("hybrid-pd proxy listening on "), line
        yield proxy, line.split()[-1]
    finally:
        for proc in (proxy, workers):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(5)
        if proxy is not None:
            proxy.stdout.close()


def wait_listening(port: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def refused(url: str) -> bool:
    host, port = url.removeprefix("http://").split(":")
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
        return False
    except ConnectionRefusedError:
        return True


async def exit_code(proc: subprocess.Popen, timeout_s: float) -> int:
    return await asyncio.to_thread(proc.wait, timeout_s)


class Stream:
    """One streamed completion through the proxy: its events, read as they come."""

    def __init__(self, session: aiohttp.ClientSession, url: str):
        self.session, self.url = session, url
        self.events: list[str] = []
        self.first = asyncio.Event()

    async def run(self) -> list[str]:
        async with self.session.post(self.url + "/v1/completions", json=BODY) as r:
            assert r.status == 200
            async for line in r.content:
                if line.startswith(b"data: "):
                    self.events.append(line[6:].decode().strip())
                    self.first.set()
        return self.events


async def start_stream(session: aiohttp.ClientSession, url: str) -> tuple[Stream, asyncio.Task]:
    stream = Stream(session, url)
    task = asyncio.create_task(stream.run())
    await asyncio.wait_for(stream.first.wait(), 10)  # in flight: its first event arrived
    return stream, task


def test_sigterm_drains_streams_serves_the_window_then_refuses_and_exits_0():
    tokens, delay_s = 20, 1.5

    async def body(proxy: subprocess.Popen, url: str) -> None:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
            _, in_flight_task = await start_stream(s, url)
            proxy.send_signal(signal.SIGTERM)
            t0 = time.monotonic()
            while True:  # the signal reaches the proxy's loop a moment later
                async with s.get(url + "/health") as r:
                    if r.status == 503:
                        assert (await r.json())["status"] == "draining"
                        break
                await asyncio.sleep(0.01)
            assert time.monotonic() - t0 < 1.0
            async with s.get(url + "/livez") as r:
                assert r.status == 200
            _, during_task = await start_stream(s, url)  # a request inside the drain window is served
            while not refused(url):
                await asyncio.sleep(0.05)
            closed_after = time.monotonic() - t0
            assert delay_s - 0.2 <= closed_after <= delay_s + 2.0, closed_after
            for events in (await in_flight_task, await during_task):
                assert len(events) == tokens + 1 and events[-1] == "[DONE]", events[-3:]
                assert all("choices" in json.loads(e) for e in events[:-1])
            assert await exit_code(proxy, 5) == 0
            assert time.monotonic() - t0 < delay_s + 6.0  # the streams' 2 s, not the 10 s timeout

    with fleet(tokens, 100, "--drain-delay-s", str(delay_s), "--drain-timeout-s", "10") as (proxy, url):
        asyncio.run(asyncio.wait_for(body(proxy, url), 30))


def test_a_stream_past_the_drain_timeout_is_cut_with_an_openai_error_event():
    async def body(proxy: subprocess.Popen, url: str) -> None:
        async with aiohttp.ClientSession() as s:
            _, task = await start_stream(s, url)
            proxy.send_signal(signal.SIGTERM)
            t0 = time.monotonic()
            events = await asyncio.wait_for(task, 10)  # the chunked body ends properly
            assert "[DONE]" not in events and len(events) < 100
            error = json.loads(events[-1])["error"]
            assert error["code"] == "shutting_down" and error["type"] == "service_unavailable"
            assert "--drain-timeout-s" in error["message"]
            assert await exit_code(proxy, 5) == 0
            assert 0.9 <= time.monotonic() - t0 < 6.0

    with fleet(200, 50, "--drain-delay-s", "0", "--drain-timeout-s", "1") as (proxy, url):
        asyncio.run(asyncio.wait_for(body(proxy, url), 30))


def test_a_second_signal_stops_at_once():
    async def body(proxy: subprocess.Popen, url: str) -> None:
        async with aiohttp.ClientSession() as s:
            _, task = await start_stream(s, url)
            proxy.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.3)
            assert not refused(url)  # still in its 30 s drain window
            t0 = time.monotonic()
            proxy.send_signal(signal.SIGINT)
            assert await exit_code(proxy, 5) == 0
            assert time.monotonic() - t0 < 2.5
            events = await asyncio.wait_for(task, 5)
            assert json.loads(events[-1])["error"]["code"] == "shutting_down"

    with fleet(200, 50, "--drain-delay-s", "30", "--drain-timeout-s", "60") as (proxy, url):
        asyncio.run(asyncio.wait_for(body(proxy, url), 30))
