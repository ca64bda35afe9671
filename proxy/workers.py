"""The worker pool: who serves which role, who is admitted (healthy), and how busy each one is.

Discovery (static list or Kubernetes) replaces a role's worker list; a worker that stays keeps its state (the
same URL, KV-event endpoint and, where known, engine identity). Health checks and failed requests move a worker
between admitted and ejected; a terminating one (Kubernetes: still serving, going away) is not admitted, but it
stays: its requests in flight finish and its KV index follows its events.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from .config.sections import WorkerSpec, same_engine

Role = Literal["prefill", "decode"]
log = logging.getLogger("hybrid_pd.proxy")


@dataclass(frozen=True)
class EngineLoad:
    """A worker's own load as its engine reports it (vLLM's /metrics: proxy/engine_load.py): every proxy's
    requests, not only this one's."""

    running: float  # in the engine's batch
    waiting: float  # queued for a slot
    kv_usage: float | None = None  # KV cache in use, 0-1


@dataclass(eq=False)
class Worker:
    url: str
    role: Role
    events: str | None = None
    identity: str | None = None  # the engine's identity where discovery knows one (a pod UID)
    inbox: str | None = None  # a decoder's params inbox (early decode), tcp://host:port
    terminating: bool = False  # takes no new requests
    healthy: bool = True
    in_flight: int = 0
    queued_tokens: int = 0  # uncached prompt tokens of the requests in flight (what it still has to prefill)
    engine: EngineLoad | None = None  # the engine's own figures, last read (None: not read, or unreadable)
    sent_since_read: int = 0  # requests this proxy sent it since `engine` was read
    done_since_read: int = 0  # requests of this proxy's that ended on it since `engine` was read
    failures: int = 0  # consecutive failed health checks
    successes: int = 0  # consecutive good health checks while ejected

    @property
    def load(self) -> float:
        """Requests on this worker: where its engine's figures are read, everything every proxy sent it
        (running + waiting, plus what this proxy sent since the read); else this proxy's own in flight. The max
        with in_flight: this proxy's request still in its prefill leg is not on the decoder's engine yet."""
        if self.engine is None:
            return self.in_flight
        return max(self.in_flight, self.engine.running + self.engine.waiting + self.sent_since_read)

    @property
    def streams(self) -> float:
        """Requests on this worker now, for placement: `load` less this proxy's requests that ended since the
        engine's figures were read (a turn right after another must not see the first one as running)."""
        if self.engine is None:
            return self.in_flight
        engine = self.engine.running + self.engine.waiting + self.sent_since_read - self.done_since_read
        return max(self.in_flight, engine)

    def __repr__(self) -> str:
        state = ("" if self.healthy else " ejected") + (" terminating" if self.terminating else "")
        return f"Worker({self.role} {self.url}{state}, in_flight={self.in_flight})"


Listener = Callable[[str, Worker], None]  # ("added" | "removed", worker)


class WorkerPool:
    def __init__(self) -> None:
        self._workers: dict[Role, list[Worker]] = {"prefill": [], "decode": []}
        self._listeners: list[Listener] = []

    def on_change(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def set_workers(self, role: Role, specs: Sequence[WorkerSpec]) -> None:
        old = {w.url: w for w in self._workers[role]}
        new: list[Worker] = []
        for spec in specs:
            w = old.pop(spec.url, None)
            if w is None or w.events != spec.events or not same_engine(w.identity, spec.identity):
                if w is not None:
                    self._emit("removed", w)
                w = Worker(spec.url, role, spec.events, spec.identity, spec.inbox)
                self._emit("added", w)
            if w.terminating != spec.terminating:
                log.info(
                    "%s worker %s %s",
                    role,
                    w.url,
                    "is terminating: no new requests" if spec.terminating else "takes requests again",
                )
            w.terminating, w.identity, w.inbox = spec.terminating, w.identity or spec.identity, spec.inbox
            new.append(w)
        for w in old.values():
            self._emit("removed", w)
        self._workers[role] = new

    def all(self, role: Role | None = None) -> list[Worker]:
        if role is None:
            return self._workers["prefill"] + self._workers["decode"]
        return list(self._workers[role])

    def has(self, role: Role) -> bool:
        """Whether any worker of the role is in the pool (admitted or not): all(role) without its copy."""
        return bool(self._workers[role])

    def admitted(self, role: Role) -> list[Worker]:
        return [w for w in self._workers[role] if w.healthy and not w.terminating]

    def eject(self, w: Worker, why: str) -> None:
        if w.healthy:
            log.warning("ejecting %s worker %s: %s", w.role, w.url, why)
        w.healthy, w.successes = False, 0

    def readmit(self, w: Worker) -> None:
        if not w.healthy:
            log.info("re-admitting %s worker %s", w.role, w.url)
        w.healthy, w.failures = True, 0

    @staticmethod
    def busy(w: Worker, tokens: int = 0) -> Busy:
        """`with pool.busy(w) as busy:` counts a request in flight on w, and `tokens` it has to compute (a
        class: this runs twice per request)."""
        return Busy(w, tokens)

    def _emit(self, what: str, w: Worker) -> None:
        for listener in self._listeners:
            listener(what, w)


class Busy:
    """One request counted in flight on a worker for the `with` block; `keep()` inside the block keeps it counted
    past the block, until `release()` (a prefill answer left behind still occupies P)."""

    __slots__ = ("worker", "tokens", "_held", "_kept")

    def __init__(self, worker: Worker, tokens: int = 0):
        self.worker, self.tokens = worker, tokens
        self._held = self._kept = False

    def __enter__(self) -> Busy:
        self.worker.in_flight += 1
        self.worker.sent_since_read += 1
        self.worker.queued_tokens += self.tokens
        self._held = True
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._kept:
            self.release()

    def keep(self) -> None:
        self._kept = True

    def prefilled(self) -> None:
        """The request's prompt is computed (its first token is out): its tokens leave the worker's queue."""
        if self._held and self.tokens:
            self.worker.queued_tokens -= self.tokens
            self.tokens = 0

    def release(self) -> None:
        if self._held:
            self._held = False
            self.worker.in_flight -= 1
            self.worker.done_since_read += 1
            self.worker.queued_tokens -= self.tokens
