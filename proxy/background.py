"""The proxy's background tasks, started with the app and stopped with it: active health checks, reads of each
worker's own load (engine_load.py), one KV-event subscription per worker that announces an events endpoint
(following discovery's changes), and Kubernetes discovery."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable

import zmq.asyncio

from .engine_load import read_once
from .errors import UpstreamError
from .health import check_once
from .kv.subscriber import subscribe
from .pair_warmup import PAIR_WARMUP_WAIT_S, warm_pairs
from .state import ProxyState
from .tokenizer import LocalTokenizer
from .workers import Worker

log = logging.getLogger("hybrid_pd.proxy")


async def every(interval_s: float, round_: Callable[[ProxyState], Awaitable[None]], state: ProxyState) -> None:
    """Run `round_` every `interval_s` seconds until cancelled; a failed round is logged, the loop goes on."""
    while True:
        try:
            await round_(state)
        except Exception:  # a background loop must not die: log and try again next round
            log.exception("background round %s failed", round_.__qualname__)
        await asyncio.sleep(interval_s)


MODEL_FOLDER_RETRY_S = 2.0
PAIR_WARMUP_ROUND_S = 1.0  # how soon a pair admitted (or back) is warmed
TOKENIZER_READY_WAIT_S = 120.0


async def load_tokenizer(state: ProxyState) -> None:
    """Load the model's tokenizer into the proxy (in a thread: transformers imports torch and loads for 10 s on a
    small CPU). Until it has loaded or failed, /health (readiness) answers 503: a proxy taking traffic meanwhile
    pays a worker's /tokenize per prompt and shares its interpreter with the import (on an H200 run, 8-20 ms
    more per turn than once loaded), for TOKENIZER_READY_WAIT_S at most (a folder that never resolves, a load
    that hangs). When it cannot load, prompts are tokenized through the workers' /tokenize."""
    try:
        await _load_tokenizer(state)
    finally:
        state.tokenizer_loading_until = 0.0


async def _load_tokenizer(state: ProxyState) -> None:
    source: str | None = state.config.kv.tokenizer
    cached_only = False
    if source == "auto":
        while (source := await model_folder(state)) is None:
            await asyncio.sleep(MODEL_FOLDER_RETRY_S)
        # a folder on this machine, or a Hugging Face id the workers downloaded into a cache this machine reads
        # (the Kubernetes proxy mounts the workers' model volume read-only, HF_HOME on it): never a download
        cached_only = not os.path.isdir(source)
    assert source is not None
    try:
        state.tokenizer = await asyncio.to_thread(LocalTokenizer.load, source, cached_only)
    except Exception as e:  # whatever transformers raises for a folder or id it cannot load
        where = " (neither a folder nor an id in this machine's Hugging Face cache)" if cached_only else ""
        log.warning(
            "the tokenizer %s did not load%s (%r): prompts are tokenized through the workers' /tokenize "
            "(--tokenizer names a local copy)",
            source,
            where,
            e,
        )
        return
    state.metrics.tokenizer_local.set(1)
    log.info("tokenizing prompts in the proxy with the tokenizer of %s", source)


async def model_folder(state: ProxyState) -> str | None:
    """The model folder (`root`) a decoder's /v1/models names, or None while no decoder answers."""
    for w in state.pool.admitted("decode"):
        try:
            answer = await state.upstream.get_json(
                w.url, "/v1/models", timeout=state.config.timeouts.health_s, stage="models"
            )
        except UpstreamError:
            continue
        data = answer.get("data") if isinstance(answer, dict) else None
        if isinstance(data, list) and data and isinstance(data[0], dict):
            root = data[0].get("root") or data[0].get("id")
            if isinstance(root, str) and root:
                return root
    return None


class Background:
    def __init__(self, state: ProxyState):
        self.state = state
        self.tasks: list[asyncio.Task] = []
        self.subscriptions: dict[Worker, asyncio.Task] = {}
        self.retired: list[asyncio.Task] = []  # cancelled with their worker; awaited at stop (sockets close)
        self._zmq: zmq.asyncio.Context | None = None

    async def start(self) -> None:
        s = self.state
        for w in s.pool.all():
            self._added(w)
        s.pool.on_change(self._changed)
        if s.config.health.interval_s > 0:
            self.tasks.append(asyncio.create_task(every(s.config.health.interval_s, check_once, s), name="health"))
        if s.config.health.load_interval_s > 0:
            load = every(s.config.health.load_interval_s, read_once, s)
            self.tasks.append(asyncio.create_task(load, name="engine-load"))
        if s.config.tokenize and s.config.kv.tokenizer != "remote":
            s.tokenizer_loading_until = time.monotonic() + TOKENIZER_READY_WAIT_S  # set before the first /health
            self.tasks.append(asyncio.create_task(load_tokenizer(s), name="tokenizer"))
        if s.config.disagg.warm_pairs and s.config.disagg.enabled:
            s.pairs_warming_until = time.monotonic() + PAIR_WARMUP_WAIT_S  # set before the first /health
            self.tasks.append(asyncio.create_task(every(PAIR_WARMUP_ROUND_S, warm_pairs, s), name="pair-warmup"))
        if s.config.discovery == "k8s":
            from .discovery.k8s import discovery_loop

            self.tasks.append(asyncio.create_task(discovery_loop(s), name="k8s-discovery"))

    async def stop(self) -> None:
        tasks = self.tasks + list(self.subscriptions.values()) + self.retired
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self.tasks.clear()
        self.subscriptions.clear()
        self.retired.clear()
        if self._zmq is not None:
            self._zmq.term()
            self._zmq = None

    def _changed(self, what: str, w: Worker) -> None:
        if what == "added":
            self._added(w)
        else:
            task = self.subscriptions.pop(w, None)
            if task is not None:
                task.cancel()
                self.retired = [t for t in self.retired if not t.done()] + [task]
            self.state.kv_index.retire(w.url, w.identity)  # kept --kv-index-grace-s for the same worker back
            with contextlib.suppress(KeyError):
                self.state.metrics.worker_healthy.remove(w.role, w.url)

    def _added(self, w: Worker) -> None:
        if self.state.kv_index.revive(w.url, w.identity):
            log.info("%s worker %s is back within --kv-index-grace-s: its KV index is kept", w.role, w.url)
        self.state.metrics.worker_healthy.labels(w.role, w.url).set(1 if w.healthy else 0)
        if w.events:
            if self._zmq is None:
                self._zmq = zmq.asyncio.Context()
            self.subscriptions[w] = asyncio.create_task(
                subscribe(self._zmq, w, self.state.kv_index, self.state.metrics), name=f"kv-events {w.url}"
            )
