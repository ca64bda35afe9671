"""Each worker's own load, read from its engine's /metrics, so that proxy replicas agree on it.

A proxy counts the requests it has in flight on each worker (Worker.in_flight). With N replicas behind one
Service each sees about 1/N of a decoder's streams, and least-loaded routing and the load-aware
disaggregation decide on that. vLLM reports its own figures, which count every replica's requests:

    vllm:num_requests_running   requests in the engine's batch        (summed over the engine's series)
    vllm:num_requests_waiting   requests queued for a slot            (summed)
    vllm:kv_cache_usage_perc    KV cache in use, 0-1                  (the largest)

Every `--load-interval` seconds this loop reads them from every worker into `Worker.engine`, and
`Worker.load` (workers.py) is what routing reads. A worker whose metrics cannot be read falls back to this
proxy's own count until the next read succeeds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

from .state import ProxyState
from .workers import EngineLoad

log = logging.getLogger("hybrid_pd.proxy")
RUNNING, WAITING, KV_USAGE = "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"


def samples(text: str) -> Iterator[tuple[str, float]]:
    """(metric name, value) of each sample line of a Prometheus text exposition."""
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        brace, space = line.find("{"), line.find(" ")
        if brace != -1 and (space == -1 or brace < space):
            name, rest = line[:brace], line[line.rfind("}") + 1 :]
        else:
            name, rest = line[:space], line[space:]
        try:
            yield name, float(rest.split()[0])
        except (IndexError, ValueError):
            continue


def parse(text: str) -> EngineLoad | None:
    """The engine's load from its /metrics; None when they hold neither running nor waiting requests."""
    sums = {RUNNING: 0.0, WAITING: 0.0}
    seen, kv = False, None
    for name, value in samples(text):
        if name in sums:
            sums[name] += value
            seen = True
        elif name == KV_USAGE:
            kv = value if kv is None else max(kv, value)
    return EngineLoad(sums[RUNNING], sums[WAITING], kv) if seen else None


async def read_once(state: ProxyState) -> None:
    workers = state.pool.all()
    sent = [w.sent_since_read for w in workers]  # requests sent before the read: the engine may count them
    done = [w.done_since_read for w in workers]  # and those that ended before it: it does not
    texts = await asyncio.gather(*(state.upstream.get_text(w.url, "/metrics") for w in workers))
    for w, before, ended, text in zip(workers, sent, done, texts):
        w.engine = parse(text) if text else None
        w.sent_since_read = max(0, w.sent_since_read - before)
        w.done_since_read = max(0, w.done_since_read - ended)
