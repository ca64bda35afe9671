"""The narrow interfaces routing plugins implement, and what they see of a request.

    Scorer  score(ctx, workers) -> one float in [0, 1] per worker (1 = best)
    Picker  pick(ctx, workers, scores) -> one worker, given the weighted scores

A policy (config/sections.py: Policy) is a weighted list of scorers and one picker; router.py composes them. Plugins are
stateless apart from their own bookkeeping (a round-robin cursor), and never see the HTTP request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ..config.sections import KVIndexConfig
from ..kv.index import KVIndex
from ..kv.prompt_keys import ChainCache, PromptKeys
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
    hash_cache: ChainCache | None = None  # the proxy's, shared by its requests
    hits_known: bool = False  # hits holds every indexed worker's (one pass over the index, kv_hit.hit_tokens)
    attention_hits: dict[str, int] | None = None  # worker URL -> attention-only prefix (kv_hit.attention_hits)
    _keys: dict[int, PromptKeys] = field(default_factory=dict)

    def keys_for(self, hash_block_size: int) -> PromptKeys:
        """The prompt's block keys at this granularity, hashed lazily and at most once per request."""
        keys = self._keys.get(hash_block_size)
        if keys is None:
            keys = self._keys[hash_block_size] = PromptKeys(
                self.token_ids or (), hash_block_size, self.hash_algo, self.hash_seed, self.cache_salt, self.hash_cache
            )
        return keys


@dataclass(frozen=True)
class Deps:
    """Shared state a plugin may read."""

    kv_index: KVIndex
    kv: KVIndexConfig


class Scorer(Protocol):
    def score(self, ctx: RequestContext, workers: Sequence[Worker]) -> list[float]: ...


class Picker(Protocol):
    def pick(self, ctx: RequestContext, workers: Sequence[Worker], scores: Sequence[float]) -> Worker: ...
