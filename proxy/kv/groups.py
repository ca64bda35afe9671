"""The KV-cache groups as the workers' KV events describe them, and the two block sizes routing derives.

One model per deployment: every worker's events teach the same groups (group_idx -> vLLM's spec kind and block
size), so a Mamba group one worker never stored into still limits the hits of all of them. The connector's
plan.GroupSpec is its own view of a group (attention or mamba).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ATTENTION_KINDS = frozenset({"full_attention", "mla_attention", "sink_full_attention"})
MAMBA_KIND = "mamba"
DEVICE_MEDIA = frozenset({None, "GPU"})  # only the GPU tier counts: the engine hits there first


@dataclass
class EventGroup:
    """A KV-cache group as the events name it (vLLM's spec kind names: full_attention, mamba, ...)."""

    kind: str
    block_size: int


def hash_block_size(specs: dict[int, EventGroup], configured: int = 0) -> int:
    """vLLM's default hash_block_size is the gcd of the groups' block sizes (prefix_match_unit unset)."""
    if configured:
        return configured
    sizes = [g.block_size for g in specs.values() if g.block_size > 0]
    return math.gcd(*sizes) if sizes else 0


def aligned_block(specs: dict[int, EventGroup]) -> int:
    """Tokens per aligned block (the lcm of the groups' block sizes; 0 while no event told them): the unit of
    every hybrid hit, and the least a remote prefill should move."""
    sizes = [g.block_size for g in specs.values() if g.kind in ATTENTION_KINDS or g.kind == MAMBA_KIND]
    return math.lcm(*sizes) if sizes else 0
