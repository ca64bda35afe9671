"""The narrow interfaces routing plugins implement, and what they see of a request.

    Scorer  score(ctx, workers) -> one float in [0, 1] per worker (1 = best)
    Picker  pick(ctx, workers, scores) -> one worker, given the weighted scores

A policy (config/sections.py: Policy) is a weighted list of scorers and one picker; router.py composes them. Plugins are
stateless apart from their own bookkeeping (a round-robin cursor), and never see the HTTP request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ..config.sections import KVIndexConfig
from ..kv.index import KVIndex
from ..kv.request_hits import PromptHits
from ..workers import Worker


@dataclass
class RequestContext(PromptHits):
    """What routing knows about one request: its session, and its prompt with the hits the KV index answered
    (kv/request_hits.py: the memo every consumer reads)."""

    session: str | None = None


@dataclass(frozen=True)
class Deps:
    """Shared state a plugin may read."""

    kv_index: KVIndex
    kv: KVIndexConfig

    @property
    def hash_block_size(self) -> int:
        return self.kv.hash_block_size


class Scorer(Protocol):
    def score(self, ctx: RequestContext, workers: Sequence[Worker]) -> list[float]: ...


class Picker(Protocol):
    def pick(self, ctx: RequestContext, workers: Sequence[Worker], scores: Sequence[float]) -> Worker: ...
