"""CPU per request of the whole PD flow in one process: the fake workers, the proxy and a raw client on one loop.

    python -m benchmarks.proxy_inproc [--requests 5000] [--rounds 5] [--stream] [--floor] [--prompt-ids 9000]
    PYTHONPATH=DIR python -m benchmarks.proxy_inproc ...          (the proxy as importable from DIR: an older copy)

proxy_ab.py measures the proxy's own process against its peers, each woken three times per request by the
others: what a deployment pays, and noisy on a shared machine. Here nothing sleeps between the steps of a
request (everything runs on one core, one loop), so the figure is the code's own cost with warm caches, a few
percent apart from run to run: fit for a change of a few microseconds, and for taking parts out one at a time.
It counts the fake workers' and the client's work too (the same in every run), so compare runs, not the value.
--floor puts benchmarks/proxy_floor.py (uvicorn and our HTTP client, nothing else) where the proxy was.
Each round prints CPU microseconds per request (process_time), and the cyclic collector's runs in the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import statistics
import time

import uvloop

from benchmarks.procs import free_port
from benchmarks.proxy_fake_workers import Answers, FakeWorker


class Client(asyncio.Protocol):
    """Keep-alive, one request at a time; an answer ends at its Content-Length, or a chunked one at its last chunk."""

    def __init__(self) -> None:
        self.buf = b""
        self.done: asyncio.Future | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.buf[:end].lower()
        at = head.find(b"content-length: ")
        if at < 0:
            complete = self.buf.endswith(b"\r\n0\r\n\r\n")
        else:
            complete = len(self.buf) >= end + 4 + int(head[at + 16 :].split(b"\r\n", 1)[0])
        if complete and self.done is not None:
            self.buf = b""
            self.done.set_result(None)


async def start_floor(p_url: str, d_url: str, stack: contextlib.AsyncExitStack) -> int:
    import uvicorn

    from benchmarks.proxy_floor import app_for

    port = free_port()
    config = uvicorn.Config(app_for(p_url, d_url), host="127.0.0.1", port=port, http="httptools", loop="none",
                            interface="asgi3", lifespan="off", access_log=False, log_level="warning",
                            server_header=False, date_header=False)
    config.load()
    server = uvicorn.Server(config)
    server.lifespan = config.lifespan_class(config)
    await server.startup()
    stack.push_async_callback(server.shutdown)
    return port


async def start_proxy(p_url: str, d_url: str, stack: contextlib.AsyncExitStack) -> int:
    from hybrid_pd.proxy.app import serve_in_background
    from hybrid_pd.proxy.config.sources import load_config

    config = load_config(["--port", "0", "--prefill", p_url, "--decode", d_url, "--log-level", "WARNING"])
    proxy = await stack.enter_async_context(serve_in_background(config))
    while not proxy.state.pool.admitted("decode"):
        await asyncio.sleep(0.05)
    return int(proxy.url.rsplit(":", 1)[1])


async def main(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    answers = Answers(args.tokens)
    p_port, d_port = free_port(), free_port()
    for port in (p_port, d_port):
        await loop.create_server(lambda: FakeWorker(answers), "127.0.0.1", port)
    p_url, d_url = f"http://127.0.0.1:{p_port}", f"http://127.0.0.1:{d_port}"
    async with contextlib.AsyncExitStack() as stack:
        await measure(await (start_floor if args.floor else start_proxy)(p_url, d_url, stack), args)


async def measure(port: int, args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    prompt = (b"[%b]" % b", ".join(b"%d" % (10 + i * 7919 % 150000) for i in range(args.prompt_ids)) if args.prompt_ids
              else b'"%b"' % (b"hello world " * 50))
    body = b'{"model": "fake-model", "prompt": %b, "max_tokens": %d, "stream": %s}' % (
        prompt, args.tokens, b"true" if args.stream else b"false")
    request = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
    _, client = await loop.create_connection(Client, "127.0.0.1", port)

    async def one() -> None:
        client.done = loop.create_future()
        client.transport.write(request)  # type: ignore[union-attr]
        await client.done

    for _ in range(2000):  # warm-up: connections, the interpreter's specializations
        await one()
    per_round = []
    collections = sum(s["collections"] for s in gc.get_stats())
    for _ in range(args.rounds):
        t = time.process_time()
        for _ in range(args.requests):
            await one()
        per_round.append((time.process_time() - t) / args.requests * 1e6)
    collections = sum(s["collections"] for s in gc.get_stats()) - collections
    print(f"CPU us per request: {', '.join(f'{x:.1f}' for x in per_round)} (min {min(per_round):.1f}, median "
          f"{statistics.median(per_round):.1f}); cyclic collections: {collections}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=5000, help="per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--prompt-ids", type=int, default=0,
                    help="N: the prompt as N token ids (a real shape's 8k turn: 9000), not 50 words of text")
    ap.add_argument("--floor", action="store_true", help="benchmarks/proxy_floor.py in the proxy's place")
    uvloop.run(main(ap.parse_args()))
