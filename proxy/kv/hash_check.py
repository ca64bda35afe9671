"""Check from a worker's own events that the proxy reproduces its block hashes, and learn their granularity.

A BlockStored event carries the parent hash, the tokens and the hash of its first block. Chaining those
tokens from the parent in chunks of g tokens reproduces the published hash only for the right algorithm, seed
and hash_block_size g (vLLM's prefix_match_unit, or the gcd of the group block sizes). So the first such event
either confirms the proxy's hashing and tells g, or says loudly that routing by KV events cannot work with the
configured --kv-hash-algo / --kv-hash-seed.
"""

from __future__ import annotations

from .block_hash import HASH_FUNCTIONS, as_int_hash, none_hash
from .events import BlockStored

CANNOT_TELL = 0


def hash_granularity(ev: BlockStored, algo: str, seed: str) -> int | None:
    """The g (a divisor of ev.block_size) that reproduces ev.block_hashes[0]; None when none does; CANNOT_TELL
    when the event cannot decide (extra keys such as LoRA or cache_salt, too few tokens, an int parent hash)."""
    bs = ev.block_size
    if not ev.block_hashes or bs <= 0 or len(ev.token_ids) < bs or any(k is not None for k in ev.extra_keys or ()):
        return CANNOT_TELL
    if len(ev.token_ids) != len(ev.block_hashes) * bs:
        return CANNOT_TELL  # a sparse (Mamba) store: vLLM 0.26 lists only the kept blocks' hashes over the span
    parent = ev.parent_block_hash
    if isinstance(parent, int):
        return CANNOT_TELL  # VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES truncates: the chain cannot be continued
    target = ev.block_hashes[0]
    fn = HASH_FUNCTIONS[algo]
    start = parent if parent is not None else none_hash(algo, seed)
    for g in sorted((d for d in range(1, bs + 1) if bs % d == 0), reverse=True):
        h = start
        for i in range(0, bs, g):
            h = fn((h, tuple(ev.token_ids[i : i + g]), None))
        if h == target or (isinstance(target, int) and as_int_hash(h) == target):
            return g
    return None
