"""The aligned block vLLM picks for a hybrid model, read from its start-up log, and what it means for the
flags the user gave.

In align mode vLLM grows the attention block until one attention page holds at least one Mamba page; that
block is the granularity of every hybrid prefix hit (attention blocks AND a Mamba checkpoint at the same
boundary). Users do not choose it and rarely see it, and it bites: a max_model_len below two blocks leaves no
cacheable prefix at all (vLLM #48401: Nemotron-3-Super, 8,320-token blocks under max_model_len 4,096, 0 hits
in 10,608 queries), and a --checkpoint-every that is not a multiple of it keeps no state where hits happen.
"""

from __future__ import annotations

import re

PATTERNS = (re.compile(r"Setting attention block size to (\d+) tokens"), re.compile(r"kv lcm block sizes (\d+)"))


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
                return self.messages()
        return []

    def messages(self) -> list[str]:
        b = self.block
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
