"""A prompt's block keys as routing reads them: hashed lazily, and remembered across requests.

Routing walks a prompt's blocks in order and stops where no worker holds the prefix (fleet_hit.py), so the keys
are hashed only as far as it asks (PromptKeys.upto). Hashing itself cannot get cheaper than vLLM's (one pickle
and one sha256 per block, for the same bytes: block_hash.py), but most of a prompt was hashed before: an agent's
next turn repeats its last prompt, and every request starts with the same system prompt. ChainCache keeps the
chains of recent prompts as a trie of token chunks, so a prefix seen before costs one dict lookup per block:

    root[(algo, seed, salt, h)] --chunk t[0:h]--> [digest_1, key_1, children] --chunk t[h:2h]--> [digest_2, ...]

A chunk's digest depends on the whole path to it, which the trie position encodes. The cache is bounded by
blocks: past `max_blocks` it starts over empty (O(1), amortized; a bigger cap trades memory, ~0.5 KB a block,
for fewer cold prompts).
"""

from __future__ import annotations

from collections.abc import Sequence

from .block_hash import DEFAULT_NONE_HASH_SEED, HASH_FUNCTIONS, KEY_MASK, block_key, extend_chain, keys_of, none_hash

Node = dict[tuple[int, ...], list]  # chunk -> [digest, key, child node or None]


class ChainCache:
    """Chained block hashes of recent prompts (one per proxy, shared by its requests)."""

    def __init__(self, max_blocks: int = 1 << 16) -> None:
        self.max_blocks = max_blocks
        self.blocks = 0
        self._roots: dict[tuple[str, str, str | None, int], Node] = {}

    def root(self, algo: str, seed: str, salt: str | None, h: int) -> Node:
        if self.blocks > self.max_blocks:
            self._roots.clear()
            self.blocks = 0
        return self._roots.setdefault((algo, seed, salt, h), {})


class PromptKeys:
    """One prompt's block keys at granularity h (block_hash.block_key of vLLM's chained hashes), hashed only as
    far as a reader asks, through `cache` when given."""

    CHUNK = 16  # blocks hashed per extension: amortizes the call without hashing far past the last hit

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
        self.keys: list[int] = []
        self._parent = none_hash(algo, seed)
        self._node: Node | None = cache.root(algo, seed, cache_salt, h) if cache is not None and h > 0 else None

    def upto(self, n: int) -> list[int]:
        """self.keys, holding at least the first min(n, total) keys."""
        if n > len(self.keys) < self.total:
            first = len(self.keys)
            last = min(self.total, max(n, first + self.CHUNK))
            if self._node is not None:
                self._walk(first, last)
            else:
                digests = extend_chain(self._parent, self._tokens, self.h, first, last, self.algo, self.cache_salt)
                self.keys += keys_of(digests) if len(digests[0]) == 32 else [block_key(d) for d in digests]
                self._parent = digests[-1]
        return self.keys

    def _walk(self, first: int, last: int) -> None:
        """Blocks [first, last) through the cache's trie, hashing (and adding) the chunks it lacks."""
        node, parent, tokens, h, keys = self._node, self._parent, self._tokens, self.h, self.keys
        assert node is not None and self.cache is not None
        added, fn = 0, HASH_FUNCTIONS[self.algo]
        for s in range(first * h, last * h, h):
            chunk = tokens[s : s + h]
            entry = node.get(chunk)
            if entry is None:
                extra = (("cache_salt", self.cache_salt),) if s == 0 and self.cache_salt else None
                digest = fn((parent, chunk, extra))
                entry = node[chunk] = [digest, int.from_bytes(digest[-8:], "big") & KEY_MASK, None]
                added += 1
            parent = entry[0]
            keys.append(entry[1])
            child = entry[2]
            if child is None:
                child = entry[2] = {}
            node = child
        self._node, self._parent = node, parent
        self.cache.blocks += added
