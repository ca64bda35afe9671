"""The narrow interfaces routing plugins implement, and what they see of a request.

    Scorer  score(ctx, workers) -> one float in [0, 1] per worker (1 = best)
    Picker  pick(ctx, workers, scores) -> one worker, given the weighted scores

A policy (config_sections.Policy) is a weighted list of scorers and one picker; router.py composes them. Plugins are
stateless apart from their own bookkeeping (a round-robin cursor), and never see the HTTP request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ..config.sections import KVIndexConfig
from ..kv.block_hash import chained_block_hashes
from ..kv.index import KVIndex
from ..workers import Worker


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
                self.token_ids or [], hash_block_size, self.hash_algo, self.hash_seed, self.cache_salt
            )
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
