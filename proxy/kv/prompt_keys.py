"""A prompt's block keys as routing reads them: hashed lazily, and remembered across requests.

Routing walks a prompt's blocks in order and stops where no worker holds the prefix (fleet_hit.py), so the keys
are hashed only as far as it asks (PromptKeys.upto). Hashing itself cannot get cheaper than vLLM's (one pickle
and one sha256 per block, for the same bytes: block_hash.py), but most of a prompt was hashed before: an agent's
next turn repeats its last prompt, and every request starts with the same system prompt. ChainCache keeps the
chains of recent prompts as a trie of spans (256 tokens, 16 blocks of 16), so a prefix seen before costs one dict
lookup per span:

    root[(algo, seed, salt, h)] --t[0:256]--> [digest_16, keys 1-16, children] --t[256:512]--> [digest_32, ...]
    (h = 16)

A span's hashes depend on the whole path to it, which the trie position encodes; a span is keyed by its token ids
packed as 4-byte ints (tuples would keep every token's int object alive: 5x the memory); a prompt's partial last
span is not kept. The cache is bounded by blocks: past `max_blocks` it starts over empty (O(1), amortized; ~0.13
KB a block, so the default holds ~1M tokens of prompts in ~9 MB).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from hybrid_pd.connector.contract import DEFAULT_NONE_HASH_SEED

from .block_hash import extend_chain, keys_of, none_hash

Node = dict[bytes, list]  # a span's tokens -> [its last digest, its keys, child node or None]


class ChainCache:
    """Chained block hashes of recent prompts (one per proxy, shared by its requests)."""

    def __init__(self, max_blocks: int = 1 << 16, span_tokens: int = 256) -> None:
        self.max_blocks, self.span_tokens = max_blocks, span_tokens
        self.blocks = 0
        self._roots: dict[tuple[str, str, str | None, int], Node] = {}

    def root(self, algo: str, seed: str, salt: str | None, h: int) -> Node:
        if self.blocks > self.max_blocks:
            self._roots.clear()
            self.blocks = 0
        return self._roots.setdefault((algo, seed, salt, h), {})


class PromptKeys:
    """One prompt's block keys at granularity h (block_hash.block_key of vLLM's chained hashes), hashed only as
    far as a reader asks, a span of blocks at a time, through `cache` when given."""

    SPAN_TOKENS = 256  # a span: the blocks hashed per extension and one step of the cache's trie (its own)

    def __init__(
        self,
        token_ids: Sequence[int],
        h: int,
        algo: str = "sha256",
        seed: str = DEFAULT_NONE_HASH_SEED,
        cache_salt: str | None = None,
        cache: ChainCache | None = None,
    ) -> None:
        self._tokens = tuple(token_ids)
        self.h, self.algo, self.cache_salt, self.cache = h, algo, cache_salt, cache
        self.total = len(self._tokens) // h if h > 0 else 0  # full blocks in the prompt
        self.span = max(1, (cache.span_tokens if cache is not None else self.SPAN_TOKENS) // max(h, 1))
        self.keys: list[int] = []
        self._parent = none_hash(algo, seed)
        self._node: Node | None = cache.root(algo, seed, cache_salt, h) if cache is not None and h > 0 else None
        self._packed = b""  # the token ids as 4-byte ints, the cache's span keys (no int object kept alive)

    def upto(self, n: int) -> list[int]:
        """self.keys, holding at least the first min(n, total) keys."""
        while n > len(self.keys) < self.total:
            self._extend()
        return self.keys

    def _extend(self) -> None:
        """One more span: from the cache's trie when it has it (a lookup), else hashed (and added to it)."""
        first, h, tokens, node = len(self.keys), self.h, self._tokens, self._node
        last = first + self.span
        if last > self.total:  # a partial span: never cached
            last, node = self.total, None
        chunk, entry = b"", None
        if node is not None:
            if not self._packed:
                try:
                    self._packed = array("I", tokens).tobytes()
                except OverflowError:  # an id outside 0..2^32-1: this prompt does not use the cache
                    self._node = node = None
            chunk = self._packed[first * h * 4 : last * h * 4]
            entry = node.get(chunk) if node is not None else None
        if entry is None:
            digests = extend_chain(self._parent, tokens, h, first, last, self.algo, self.cache_salt)
            keys = keys_of(digests)
            entry = [digests[-1], keys, None]
            if node is not None and self.cache is not None:
                node[chunk] = entry
                self.cache.blocks += last - first
        self._parent = entry[0]
        self.keys += entry[1]
        if node is not None:
            child = entry[2]
            if child is None:
                child = entry[2] = {}
            self._node = child
