"""Routing: the narrow interfaces plugins implement, their registry, and the Router that composes them.

    Scorer  score(ctx, workers) -> one float in [0, 1] per worker (1 = best)
    Picker  pick(ctx, workers, scores) -> one worker, given the weighted scores

A policy (config.Policy) is a weighted list of scorers and one picker, per role. Plugins live one per module
(policy_*.py), register themselves by name, never see the HTTP request, and keep no state but their own
bookkeeping (a round-robin cursor). Built in: scorers `least_loaded`, `session_affinity`, `kv_hit`;
pickers `round_robin` (rotates among the best-scored workers: plain round robin when no scorer is set) and
`first` (the first best, deterministic).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .block_hash import chained_block_hashes
from .config import KVIndexConfig, Policy
from .errors import NoHealthyWorker
from .kv_index import KVIndex
from .workers import Worker



@dataclass
class RequestContext:
    """What routing knows about one request. Token ids are present only when the proxy tokenized the prompt."""

    session: str | None = None
    token_ids: list[int] | None = None
    cache_salt: str | None = None
    hash_algo: str = "sha256"
    hash_seed: str = "vllm-none-hash"
    hits: dict[str, int] = field(default_factory=dict)  # worker URL -> usable hybrid hit (tokens)
    _hashes: dict[int, list[bytes]] = field(default_factory=dict)

    def hashes_for(self, hash_block_size: int) -> list[bytes]:
        """The prompt's chained block hashes at this granularity, computed once per request."""
        if hash_block_size not in self._hashes:
            self._hashes[hash_block_size] = chained_block_hashes(
                self.token_ids or [], hash_block_size, self.hash_algo, self.hash_seed, self.cache_salt)
        return self._hashes[hash_block_size]


@dataclass(frozen=True)
class Deps:
    """Shared state a plugin may read."""

    kv_index: KVIndex
    kv: KVIndexConfig


class Scorer(Protocol):
    def score(self, ctx: RequestContext, workers: Sequence[Worker]) -> list[float]: ...


class Picker(Protocol):
    def pick(self, ctx: RequestContext, workers: Sequence[Worker], scores: Sequence[float]) -> Worker: ...


SCORERS: dict[str, Callable[[Deps], Scorer]] = {}
PICKERS: dict[str, Callable[[Deps], Picker]] = {}


def register_scorer(name: str) -> Callable[[Any], Any]:
    def add(factory: Any) -> Any:
        if name in SCORERS:
            raise ValueError(f"scorer {name!r} registered twice")
        SCORERS[name] = factory
        return factory
    return add


def register_picker(name: str) -> Callable[[Any], Any]:
    def add(factory: Any) -> Any:
        if name in PICKERS:
            raise ValueError(f"picker {name!r} registered twice")
        PICKERS[name] = factory
        return factory
    return add



class Router:
    def __init__(self, role: str, policy: Policy, deps: Deps):
        self.role = role
        self.policy = policy
        self.scorers = [(SCORERS[name](deps), weight) for name, weight in policy.scorers]
        self.picker = PICKERS[policy.picker](deps)
        self.total_weight = sum(weight for _, weight in policy.scorers) or 1.0

    def scores(self, ctx: RequestContext, workers: Sequence[Worker]) -> list[float]:
        total = [0.0] * len(workers)
        for scorer, weight in self.scorers:
            for i, s in enumerate(scorer.score(ctx, workers)):
                total[i] += weight * min(1.0, max(0.0, s))
        return [t / self.total_weight for t in total]

    def pick(self, ctx: RequestContext, workers: Sequence[Worker]) -> Worker:
        if not workers:
            raise NoHealthyWorker(f"no healthy {self.role} worker is admitted")
        return self.picker.pick(ctx, workers, self.scores(ctx, workers))


# The built-in plugins register themselves on import (they import this module's names, defined above).
from . import policy_first, policy_kv_hit, policy_least_loaded, policy_round_robin, policy_session_affinity  # noqa: E402,F401,I001
