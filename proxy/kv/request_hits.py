"""The per-request hit memo: what the KV index answered about one request's prompt, asked at most once each.

The request context (routing.RequestContext) is a `PromptHits`; the PD flow, the routing scorers and the
deciders all read the hits through it, so none computes another's arithmetic and one request makes at most one
pass over the index for its joint hits and one for its attention-only ones:

    keys_for(h)          the prompt's block keys at granularity h, hashed lazily (prompt_keys.py)
    all_hits(src)        every indexed worker's usable hybrid hit (attention blocks AND a Mamba checkpoint at the
                         same boundary, fleet_hit.py), kept in `hits` (`hits_known` once every worker's is there)
    hit_on(src, url)     one worker's (0 for a worker the index does not know)
    attention_only(src)  every worker's attention-only prefix, checkpoints not looked at: what a hybrid-blind
                         router calls a hit (the peers' deciders, placement/peer_policies.py)
    uncached_on(src, url)  the prompt's tokens past that worker's usable hit
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from hybrid_pd.connector.contract import DEFAULT_NONE_HASH_SEED

from .index import KVIndex
from .prompt_keys import ChainCache, PromptKeys


class HitSource(Protocol):
    """Where the hits come from: the proxy's KV index and the block size it hashes prompts at (routing.Deps)."""

    @property
    def kv_index(self) -> KVIndex: ...

    @property
    def hash_block_size(self) -> int: ...


@dataclass
class PromptHits:
    """One request's prompt as the KV index sees it. Token ids are present only when the proxy tokenized it."""

    token_ids: list[int] | None = None
    cache_salt: str | None = None
    hash_algo: str = "sha256"
    hash_seed: str = DEFAULT_NONE_HASH_SEED
    hash_cache: ChainCache | None = None  # the proxy's, shared by its requests
    hits: dict[str, int] = field(default_factory=dict)  # worker URL -> usable hybrid hit (tokens)
    hits_known: bool = False  # hits holds every indexed worker's (one pass over the index)
    attention_hits: dict[str, int] | None = None  # worker URL -> attention-only prefix (attention_only)
    _keys: dict[int, PromptKeys] = field(default_factory=dict)

    def keys_for(self, hash_block_size: int) -> PromptKeys:
        """The prompt's block keys at this granularity, hashed lazily and at most once per request."""
        keys = self._keys.get(hash_block_size)
        if keys is None:
            keys = self._keys[hash_block_size] = PromptKeys(
                self.token_ids or (), hash_block_size, self.hash_algo, self.hash_seed, self.cache_salt, self.hash_cache
            )
        return keys

    def all_hits(self, src: HitSource) -> dict[str, int]:
        """`hits`, holding every indexed worker's usable hit (one pass over the prompt's blocks, on the first call)."""
        if not self.hits_known:
            self.hits.update(src.kv_index.hits(len(self.token_ids or ()), self.keys_for, src.hash_block_size))
            self.hits_known = True
        return self.hits

    def hit_on(self, src: HitSource, url: str) -> int:
        """The usable hybrid hit on one worker; the first question answers for every indexed worker at once."""
        hits = self.hits
        if url not in hits:
            self.all_hits(src).setdefault(url, 0)  # a worker the index does not know hits nothing
        return hits[url]

    def attention_only(self, src: HitSource) -> dict[str, int]:
        """Every indexed worker's attention-only prefix of the prompt (computed once per request)."""
        if self.attention_hits is None:
            n = len(self.token_ids or ())
            self.attention_hits = src.kv_index.hits(n, self.keys_for, src.hash_block_size, attention_only=True)
        return self.attention_hits

    def uncached_on(self, src: HitSource, url: str) -> int:
        """The prompt's tokens past the worker's usable hybrid hit (0 when the prompt was not tokenized)."""
        n = len(self.token_ids or ())
        return n - self.hit_on(src, url) if n >= 2 else n
