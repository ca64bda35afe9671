"""The fleet simulator's input: requests in Mooncake's trace format, generated or read from a file.

Mooncake's traces (FAST'25, github.com/kvcache-ai/Mooncake, `traces/`) are JSON lines:

    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48, ...]}

`timestamp` in ms from the trace's start, one hash id per block of `block_size` tokens (512 in theirs; the last
id may cover a partial block). Two requests share block i exactly when they share hash_ids[0..i]: an id stands
for the whole prefix up to its block's end. We read that format as is and accept three optional fields an
agentic trace needs: `session_id`, `turn`, and `think_ms` (with `--closed-loop`, a session's next turn is sent
`think_ms` after the previous one's last token instead of at its timestamp, the way an agent waits for a reply).

The generator writes multi-turn agentic sessions from stated parameters: a system prompt shared by a group of
sessions (a tool-using agent's instructions), then turns that each append a tool result or user message and the
previous answer, so turn k+1 extends turn k's prompt; sessions arrive as a Poisson process.
"""

from __future__ import annotations

import gzip
import json
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class TraceRequest:
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: list[int]
    session_id: str = ""
    turn: int = 0
    think_ms: float = 0.0
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        out = {
            "timestamp": round(self.timestamp_ms, 3),
            "input_length": self.input_length,
            "output_length": self.output_length,
            "hash_ids": self.hash_ids,
        }
        if self.session_id:
            out |= {"session_id": self.session_id, "turn": self.turn, "think_ms": round(self.think_ms, 3)}
        return out


def load(path: str | Path) -> list[TraceRequest]:
    opener = gzip.open if str(path).endswith(".gz") else open
    out = []
    with opener(path, "rt") as f:
        for line in f:
            if not line.strip():
                continue
            d = json.loads(line)
            out.append(
                TraceRequest(
                    float(d["timestamp"]),
                    int(d["input_length"]),
                    int(d["output_length"]),
                    [int(h) for h in d["hash_ids"]],
                    str(d.get("session_id", "")),
                    int(d.get("turn", 0)),
                    float(d.get("think_ms", 0.0)),
                )
            )
    out.sort(key=lambda r: r.timestamp_ms)
    return out


def dump(requests: Iterable[TraceRequest], path: str | Path) -> None:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wt") as f:
        for r in requests:
            f.write(json.dumps(r.to_json()) + "\n")


@dataclass(frozen=True)
class AgenticParams:
    """A multi-turn agentic workload. Lengths in tokens; `block` is the trace's hash block."""

    sessions: int = 400
    rate_per_s: float = 2.0  # new sessions per second (Poisson)
    turns: tuple[int, int] = (4, 12)  # turns per session, uniform
    system_prompts: int = 8  # distinct system prompts, each shared by a group of sessions
    system_tokens: int = 3000
    first_user_tokens: tuple[int, int] = (500, 3000)
    step_tokens: tuple[int, int] = (200, 2500)  # tool result / user message appended per turn
    output_tokens: tuple[int, int] = (50, 400)
    think_ms: tuple[float, float] = (500.0, 5000.0)  # tool run time between a reply and the next turn
    max_input: int = 64000
    block: int = 544
    seed: int = 1


def agentic(p: AgenticParams) -> list[TraceRequest]:
    """Sessions in Mooncake's format (plus session_id, turn, think_ms); timestamps assume no queueing (replay
    them open loop, or closed loop for the agent's real pacing)."""
    rng = random.Random(p.seed)
    ids = iter(range(1, 1 << 62))
    systems = [[next(ids) for _ in range(p.system_tokens // p.block)] for _ in range(p.system_prompts)]
    out: list[TraceRequest] = []
    t = 0.0
    for s in range(p.sessions):
        t += rng.expovariate(p.rate_per_s) * 1000.0
        system = systems[rng.randrange(p.system_prompts)]
        length = p.system_tokens + rng.randint(*p.first_user_tokens)
        blocks = list(system)  # the ids of the session's full blocks so far (its history's prefix)
        now = t
        for turn in range(rng.randint(*p.turns)):
            if length > p.max_input:
                break
            full = length // p.block
            while len(blocks) < full:
                blocks.append(next(ids))
            tail = [next(ids)] if length % p.block else []  # the partial last block: this request's own
            out_len = rng.randint(*p.output_tokens)
            think = rng.uniform(*p.think_ms) if turn else 0.0
            out.append(TraceRequest(now, length, out_len, blocks[:full] + tail, f"s{s}", turn, think))
            # the next prompt: this one, the answer, and a tool result; the blocks past this prompt's last full
            # block are new (its partial block and the answer were never a cached full block of it)
            del blocks[full:]
            length += out_len + rng.randint(*p.step_tokens)
            now += think + 2000.0  # a guess at the reply time, for open-loop replays only
    out.sort(key=lambda r: r.timestamp_ms)
    return out


def bench_sessions(rows: list[dict], block: int, suffix_tokens: int = 10) -> list[TraceRequest]:
    """The GPU benchmark's agentic workload (benchmarks/workloads.py: agentic) rebuilt from its per-request rows:
    turn k+1 repeats turn k's prompt up to its instruction suffix (`suffix_tokens` long), sessions share nothing.
    Closed loop: each session sends its next turn when the previous answer ends (think 0)."""
    ids = iter(range(1, 1 << 62))
    out = []
    for sess in sorted({r["session"] for r in rows}, key=lambda s: int(s.lstrip("agent") or 0)):
        turns = sorted((r for r in rows if r["session"] == sess), key=lambda r: r["turn"])
        blocks: list[int] = []
        for r in turns:
            n = r["prompt_tokens"]
            full = n // block
            while len(blocks) < full:
                blocks.append(next(ids))
            tail = [next(ids)] if n % block else []
            out.append(
                TraceRequest(
                    0.0,
                    n,
                    int(r.get("completion_tokens") or 64),
                    blocks[:full] + tail,
                    sess,
                    r["turn"],
                    0.0,
                    {"row": r},
                )
            )
            keep = (n - suffix_tokens) // block  # blocks of the history without the suffix: shared with turn k+1
            del blocks[keep:]
    return out
