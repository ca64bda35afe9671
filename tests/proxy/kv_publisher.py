"""A fake vLLM KV-event publisher for the tests: a ZMQ PUB socket on 127.0.0.1 sending (topic, seq, payload)."""

from __future__ import annotations

import asyncio

import zmq
import zmq.asyncio

from hybrid_pd.proxy.kv.events import KVEventBatch, encode_frames
from hybrid_pd.proxy.kv.index import KVIndex


class FakePublisher:
    def __init__(self) -> None:
        self.ctx = zmq.asyncio.Context()
        self.sock = self.ctx.socket(zmq.PUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.seq = 0

    async def send_raw(self, frames: list[bytes]) -> None:
        await self.sock.send_multipart(frames)

    async def send(self, batch: KVEventBatch) -> int:
        await self.sock.send_multipart(encode_frames(batch, self.seq, b"kv-events"))
        self.seq += 1
        return self.seq - 1

    async def connected(self, index: KVIndex, url: str, timeout: float = 5.0) -> None:
        """ZMQ drops what a PUB sends before the SUB joined: send empty batches until one arrives."""
        async def until_seen() -> None:
            while index.workers.get(url) is None or index.workers[url].last_seq < 0:
                await self.send(KVEventBatch(ts=0.0, events=[]))
                await asyncio.sleep(0.02)
        await asyncio.wait_for(until_seen(), timeout)

    async def delivered(self, index: KVIndex, url: str, seq: int, timeout: float = 5.0) -> None:
        async def until() -> None:
            while url not in index.workers or index.workers[url].last_seq != seq:
                await asyncio.sleep(0.005)
        await asyncio.wait_for(until(), timeout)

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()
