"""The usable hybrid hit of one prompt on every worker at once: one pass over the prompt's blocks.

A hybrid model has attention groups and Mamba groups. In align mode a Mamba group caches a state only at
some block boundaries (a checkpoint), and a prefix hit of N tokens needs BOTH every attention block below N
AND a checkpoint at exactly N in every Mamba group:

    prompt hashes  h1   h2   h3   h4   h5        (chained; h_i fingerprints tokens [0, i*B))
    attention      h1   h2   h3   h4   --        contiguous prefix: 4 blocks
    mamba          --   h2   --   --   --        checkpoints at 2 blocks only (h4 evicted or never kept)
    usable hit     2 blocks = 2*B tokens         (the attention prefix alone would claim 4)

Workers are bit sets of slots (block_map.py). The attention pass walks the blocks in order with the set of workers
still holding the whole prefix, ANDs in each block's holders and stops when the set is empty, so a block costs one
dict lookup and one AND however many workers there are, and the prompt is hashed only that far (PromptKeys). The
Mamba pass then walks the aligned boundaries downwards from each worker's attention prefix and gives each worker
the first one where every Mamba group holds a checkpoint. Groups of other kinds (sliding window, ...) do not
limit the hit: the scorer is an estimate for routing, never a promise. vLLM always computes a prompt's last
token, so a hit is at most len(prompt) - 1 tokens. The answers are those of a walk worker by worker
(tests/proxy/kv_index_oracle.py; a Hypothesis property compares them).
"""

from __future__ import annotations

from .block_map import BlockMap
from .groups import ATTENTION_KINDS, MAMBA_KIND, EventGroup, aligned_block
from .prompt_keys import PromptKeys

Classes = dict[int, int]  # tokens -> bit set of the slots with that many


def usable_hits(
    specs: dict[int, EventGroup],
    maps: dict[int, BlockMap],
    h: int,
    num_tokens: int,
    keys: PromptKeys,
    everyone: int,
    attention_only: bool = False,
) -> Classes:
    """Usable hit (tokens) -> the slots of `everyone` with that hit; a slot in no class hits 0. `keys` are the
    prompt's keys at granularity h (the hash block size). `attention_only`: the attention prefix alone, as a
    hybrid-blind router sees it (the peers' deciders, placement/peer_policies.py), Mamba checkpoints not looked at."""
    attention = [(gid, g.block_size) for gid, g in specs.items() if g.kind in ATTENTION_KINDS]
    mamba = [gid for gid, g in specs.items() if g.kind == MAMBA_KIND]
    if h <= 0 or not (attention or mamba) or not everyone or num_tokens < 2:
        return {}
    classes: Classes = {min(num_tokens - 1, keys.total * h): everyone}  # vLLM computes the last token itself
    for gid, block_size in attention:
        classes = _attention_prefix(classes, maps.get(gid), block_size, block_size // h, keys)
    if not mamba or attention_only:
        return classes
    return _mamba_checkpoints(classes, [maps.get(gid) for gid in mamba], aligned_block(specs), h, keys)


def _attention_prefix(classes: Classes, blocks: BlockMap | None, size: int, k: int, keys: PromptKeys) -> Classes:
    """Each class's limit cut to the contiguous prefix of this group's blocks (of `size` tokens, every k-th key)
    the slot holds, never past the limit itself."""
    out: Classes = {}
    pending = sorted(classes.items())  # ascending limits: a class leaves the walk at its last whole block
    alive = 0
    for _, bits in pending:
        alive |= bits
    get = (blocks.blocks if blocks is not None else {}).get
    b, stored = 0, keys.keys
    for limit, bits in pending:
        end = limit // size  # blocks [0, end) fit below this class's limit
        while b < end and alive:
            j = (b + 1) * k - 1
            if j >= len(stored) or j < 0:
                stored = keys.upto(j + 1) if j >= 0 else keys.upto(keys.total)
            v = get(stored[j])
            kept = 0 if v is None else alive & (1 << v if v >= 0 else ~v)
            if kept != alive:
                out[b * size] = out.get(b * size, 0) | (alive & ~kept)
                alive = kept
            b += 1
        stop = bits & alive
        if stop:
            out[b * size] = out.get(b * size, 0) | stop
            alive &= ~stop
    return out


def _mamba_checkpoints(classes: Classes, groups: list[BlockMap | None], step: int, h: int, keys: PromptKeys) -> Classes:
    """Each slot's hit: the largest aligned boundary n <= its attention limit where every Mamba group holds a
    checkpoint (keys[n/h - 1]); none: no class (hit 0)."""
    starts: Classes = {}
    for limit, bits in classes.items():
        n = (max(limit, 0) // step) * step
        if n > 0:
            starts[n] = starts.get(n, 0) | bits
    if not starts or any(g is None for g in groups):
        return {}
    gets = [g.blocks.get for g in groups if g is not None]
    out: Classes = {}
    eligible = 0
    n = max(starts)
    stored = keys.keys
    while n > 0:
        eligible |= starts.get(n, 0)
        if eligible:
            j = n // h - 1
            if j >= len(stored):
                stored = keys.upto(j + 1)
            key, ok = stored[j], eligible
            for get in gets:
                v = get(key)
                ok &= 0 if v is None else (1 << v if v >= 0 else ~v)
                if not ok:
                    break
            if ok:
                out[n] = ok
                eligible &= ~ok
        n -= step
    return out
