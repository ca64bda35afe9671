"""Mamba checkpoints in vLLM's block pool (the scheduler side's CheckpointStore): P pins the deepest one a
request left in the prefix cache, D reserves a block to land P's in, registers it under the request's hash,
and releases what it holds. Glue: it calls vLLM's block pool and its block-hash helper."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from vllm.v1.core.kv_cache_utils import resolve_block_hashes

from hybrid_pd.connector.plan import GroupSpec

log = logging.getLogger("vllm." + __name__)  # under vLLM's configured logger


class BlockPoolCheckpoints:
    """Mamba checkpoints in vLLM's block pool: pin P's, reserve/register/release D's."""

    def __init__(self, block_pool: Any, groups: list[GroupSpec]):
        self.pool, self.groups = block_pool, groups
        self._held: dict[int, Any] = {}

    def pin(self, request: Any, group: int, tokens: int) -> tuple[int, int] | None:
        """The deepest checkpoint P holds for `request` at or below `tokens`: (block id, its boundary)."""
        bs = self.groups[group].block_size
        hashes = resolve_block_hashes(request.block_hashes, self.pool.hash_block_size, bs)
        # vLLM's align mode (prefix_cache_retention_interval) does not always keep the state at the last
        # boundary of a request that started from a prefix hit: fall back to the deepest one it kept.
        for idx in range(min(tokens // bs, len(hashes)) - 1, -1, -1):
            hit = self.pool.get_cached_block(hashes[idx], [group])
            if hit:
                self.pool.touch(hit)
                self._held[hit[0].block_id] = hit[0]
                if (idx + 1) * bs < tokens:
                    log.info(
                        "request %s: no Mamba checkpoint at %d tokens on P, shipping the one at %d",
                        request.request_id,
                        tokens,
                        (idx + 1) * bs,
                    )
                return hit[0].block_id, (idx + 1) * bs
        return None

    def reserve(self, group: int) -> int | None:
        if self.pool.get_num_free_blocks() < 64:  # never compete with running requests for the last blocks
            return None
        block = self.pool.get_new_blocks(1)[0]
        self._held[block.block_id] = block
        return block.block_id

    def register(self, request: Any, group: int, block_id: int, tokens: int) -> None:
        block = self._held[block_id]
        bs = self.groups[group].block_size
        idx = tokens // bs - 1
        blocks = [self.pool.null_block] * idx + [block]
        self.pool.cache_full_blocks(request, blocks, idx, idx + 1, bs, group)
        log.info(
            "request %s: Mamba checkpoint at %d tokens registered in block %d", request.request_id, tokens, block_id
        )

    def keep(self, request: Any, group: int, block_id: int, tokens: int) -> None:
        """P: the request's own block holding its state at `tokens` (an aligned prompt end) into the prefix cache
        under the request's block hash; a block vLLM cached already is left as it is."""
        block = self.pool.blocks[block_id]
        if block.block_hash is not None:
            return
        bs = self.groups[group].block_size
        idx = tokens // bs - 1
        self.pool.cache_full_blocks(request, [self.pool.null_block] * idx + [block], idx, idx + 1, bs, group)

    def release(self, block_ids: Iterable[int]) -> None:
        blocks = [self._held.pop(b) for b in block_ids if b in self._held]
        if blocks:
            self.pool.free_blocks(blocks)
