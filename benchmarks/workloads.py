"""Benchmark workloads: lists of completion requests whose prefix sharing mirrors real traffic.

Lengths are in tokens of the tiny model's tokenizer and are chosen relative to the aligned block size B
(256 tokens for the tiny model on CPU), so that conversations diverge before, on and after checkpoints:

- agentic: multi-turn sessions; each turn appends a user message and the assistant's answer to the history
  and ends with a fixed instruction suffix, so turn k+1 diverges from turn k where the suffix began, which is
  rarely a block boundary (the case where upstream's hybrid hits silently drop).
- shared_system: many users, one long system prompt, different questions.
- insert_middle: a document edited in the middle; the next version shares only the part before the edit.
- single: random prompts sharing nothing.

The oracle knows every boundary ever computed: a request can reuse the longest prefix it shares with any
earlier request, rounded down to B, and never the last prompt token (it must be computed to sample).
"""

from __future__ import annotations

import dataclasses
import random

WORDS = ("the quick brown fox jumps over the lazy dog prefix cache mamba state attention block token decode "
         "prefill engine server request model hello world one two three four five six seven eight nine ten "
         "user assistant system you are a helpful agent tool call result turn conversation").split()
INSTRUCTION = " Now answer with one tool call and nothing else."


@dataclasses.dataclass(frozen=True)
class Request:
    workload: str
    session: str
    turn: int
    token_ids: tuple[int, ...]
    at_s: float = 0.0  # a trace's send time (s from its start; benchmarks/trace_replay.py)
    think_s: float = 0.0  # a trace's pause after the previous turn's answer, before this turn
    max_tokens: int = 0  # a trace's output length (0: the run's)


def words(rng: random.Random, n: int) -> str:
    return " " + " ".join(rng.choice(WORDS) for _ in range(n))


class Tokens:
    """Text -> token ids with the model's own tokenizer, so lengths and the oracle are exact."""

    def __init__(self, model_dir: str):
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(model_dir)

    def __call__(self, text: str) -> tuple[int, ...]:
        return tuple(self.tok(text, add_special_tokens=False)["input_ids"])

    def sized(self, rng: random.Random, n_tokens: int) -> tuple[int, ...]:
        """A random word sequence cut to exactly n_tokens tokens."""
        ids = self(words(rng, n_tokens))
        while len(ids) < n_tokens:
            ids += self(words(rng, n_tokens))
        return ids[:n_tokens]


def agentic(tokens: Tokens, block: int, sessions: int = 2, turns: int = 5, seed: int = 1) -> list[Request]:
    rng, out = random.Random(seed), []
    suffix = tokens(INSTRUCTION)
    for s in range(sessions):
        history = tokens.sized(rng, block + block // 3)  # system prompt: not block aligned
        for t in range(turns):
            history += tokens.sized(rng, rng.randint(block // 4, block))  # user message / tool result
            out.append(Request("agentic", f"agent{s}", t, history + suffix))
            history += tokens.sized(rng, block // 8)  # the assistant's answer, kept in the history
    return out


def shared_system(tokens: Tokens, block: int, users: int = 4, seed: int = 2) -> list[Request]:
    rng = random.Random(seed)
    system = tokens.sized(rng, 2 * block + block // 2)
    return [Request("shared_system", f"user{u}", 0, system + tokens.sized(rng, block // 2)) for u in range(users)]


def insert_middle(tokens: Tokens, block: int, edits: int = 3, seed: int = 3) -> list[Request]:
    rng = random.Random(seed)
    doc = list(tokens.sized(rng, 3 * block))
    out = [Request("insert_middle", "doc", 0, tuple(doc))]
    for e in range(1, edits + 1):
        at = rng.randint(block, len(doc) - block // 2)
        doc[at:at] = tokens.sized(rng, block // 5)
        out.append(Request("insert_middle", "doc", e, tuple(doc)))
    return out


def single(tokens: Tokens, block: int, n: int = 3, seed: int = 4) -> list[Request]:
    rng = random.Random(seed)
    return [Request("single", f"single{i}", 0, tokens.sized(rng, rng.randint(block // 2, 2 * block)))
            for i in range(n)]


def all_workloads(tokens: Tokens, block: int) -> list[Request]:
    """Interleaved the way traffic arrives: sessions take turns rather than running back to back."""
    groups = [agentic(tokens, block), shared_system(tokens, block), insert_middle(tokens, block),
              single(tokens, block)]
    out: list[Request] = []
    while any(groups):
        for g in groups:
            if g:
                out.append(g.pop(0))
    return out


def oracle_hits(requests: list[Request], block: int) -> list[int]:
    """Best possible cached tokens per request, given every earlier request's prompt was cached."""
    hits, seen = [], []
    for r in requests:
        best = 0
        for prev in seen:
            n = 0
            for a, b in zip(prev, r.token_ids):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        hits.append(min(best // block * block, (len(r.token_ids) - 1) // block * block))
        seen.append(r.token_ids)
    return hits
