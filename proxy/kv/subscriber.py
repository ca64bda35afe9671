"""One asyncio ZMQ SUB socket per worker that publishes KV events; each batch goes into that worker's index.

Sequence numbers tell what was missed: a jump is counted (the index may keep a few stale hashes until later
events remove them: routing is a hint, a wrong guess costs a recompute, never a wrong answer); a number that
goes backwards means the engine restarted with an empty cache, so its index is cleared. vLLM's replay socket
is not used: a SUB connects before the engine's first store, so it misses nothing at start; a worker that left
the pool for a moment gets its index back (index.KVIndex.retire/revive) and what it missed meanwhile counts
as a gap. Replay would fill that gap, but vLLM binds its replay ROUTER on the worker, which takes a launcher
flag, a port per worker in the Service and the NetworkPolicy; not done.

Who binds: vLLM's publisher binds only a wildcard (tcp://*:port), ipc or inproc endpoint and CONNECTS to any
other, so a worker started with a concrete host (127.0.0.1, as `hybrid-pd prefill|decode` do on one machine)
expects its subscriber to bind. Hence, per endpoint: `bind:tcp://...` binds, `connect:tcp://...` connects, and a
plain loopback endpoint binds (falling back to connect when the worker bound it already) while any other
connects (a pod IP in Kubernetes, where workers listen on 0.0.0.0, i.e. tcp://*:port).
"""

from __future__ import annotations

import asyncio
import logging

import zmq
import zmq.asyncio

from ..metrics import ProxyMetrics
from ..workers import Worker
from .events import EventDecodeError, decode_frames
from .index import KVIndex

log = logging.getLogger("hybrid_pd.proxy")


LOOPBACK_PREFIXES = ("tcp://127.", "tcp://localhost:", "tcp://[::1]:")


def endpoint_mode(events: str) -> tuple[str, str]:
    """('bind' | 'connect', the ZMQ endpoint) for an events endpoint as configured."""
    for mode in ("bind", "connect"):
        if events.startswith(mode + ":"):
            return mode, events[len(mode) + 1 :]
    return ("bind" if events.startswith(LOOPBACK_PREFIXES) else "connect"), events


async def subscribe(ctx: zmq.asyncio.Context, worker: Worker, kv_index: KVIndex, metrics: ProxyMetrics) -> None:
    """Apply `worker`'s KV events to kv_index until cancelled; survives anything but cancellation."""
    while True:
        try:
            await _subscribe_once(ctx, worker, kv_index, metrics)
        except asyncio.CancelledError:
            raise
        except Exception:  # top of a background loop: log, start over with a fresh socket
            log.exception("KV-event subscription to %s failed; reconnecting", worker.events)
            await asyncio.sleep(1.0)


async def _subscribe_once(ctx: zmq.asyncio.Context, worker: Worker, kv_index: KVIndex, metrics: ProxyMetrics) -> None:
    assert worker.events is not None
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    mode, endpoint = endpoint_mode(worker.events)
    if mode == "bind":
        try:
            sock.bind(endpoint)
        except zmq.ZMQError as e:
            if e.errno != zmq.EADDRINUSE or worker.events.startswith("bind:"):
                raise
            sock.connect(endpoint)  # the worker's publisher bound it (a wildcard endpoint): connect instead
    else:
        sock.connect(endpoint)
    errors = 0
    try:
        while True:
            frames = await sock.recv_multipart()
            try:
                seq, batch = decode_frames(frames)
            except EventDecodeError as e:
                errors += 1
                metrics.kv_event_errors.labels(worker.url).inc()
                if errors == 1 or errors % 1000 == 0:
                    log.warning("KV events from %s (%s): %s (%d so far)", worker.url, worker.events, e, errors)
                continue
            index = kv_index.of(worker.url)
            if 0 <= seq <= index.last_seq:
                log.info("KV events from %s restarted at seq %d: clearing its index", worker.url, seq)
                kv_index.drop(worker.url)
                index = kv_index.of(worker.url)
            before = index.gaps
            index.note_seq(seq)
            if index.gaps > before:
                metrics.kv_event_gaps.labels(worker.url).inc(index.gaps - before)
            kv_index.apply(worker.url, batch)
            metrics.kv_events.labels(worker.url).inc()
    finally:
        sock.close(linger=0)
