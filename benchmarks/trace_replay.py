"""Mooncake-format traces (benchmarks/fleetsim_trace.py) replayed against real engines.

A trace names its prompts by block hash ids; the engines need token ids. `to_requests` gives every hash id one
block of `block` token ids of the model's vocabulary, drawn from a generator seeded by the id, so two requests
share exactly the blocks whose ids they share:

    hash_ids   [7,        8,        9    ]     input_length = 2 * block + 100
    token ids  |block(7) |block(8) |block(9)[:100]|
    other      [7,        8,        12          ]  -> the same first 2 * block tokens, then block(12)

A block begins with its id written in base V (V ordinary tokens of the vocabulary, enough digits for any 63-bit
id; a salt shifts the first), so blocks of two ids differ within their first digits even on a tiny vocabulary; the
rest is random.

Two ways to send them (both runners, benchmarks/run.py and benchmarks/gpu/bench.py, build one row per request
with their own `send`):
- closed loop at concurrency C: at most C sessions at once, each session's turns in order, the next turn
  `think_ms` after the previous answer ended (the agent runs its tool);
- open loop at R requests/s: each request sent when due, whatever is still in flight; due times are the trace's
  timestamps scaled so that they average R per second (a generated trace's sessions arrive as a Poisson process,
  which scaling keeps; a trace whose timestamps are all equal gets Poisson arrivals at R). Each send records how
  late it went out.

Generated traces (`SHAPES`, fleetsim_trace.agentic with stated parameters) stand in for a file.
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.fleetsim_trace import AgenticParams, TraceRequest, agentic, load
from benchmarks.workloads import Request, Tokens

# The GPU benchmark's 8k agentic workload (workloads.agentic at length 8192: unit u = 8192 / 3.45 = 2374 tokens;
# a 1.33u prompt plus a 0.25u-1u message first, then per turn a 0.125u answer and a 0.25u-1u message; 5 turns,
# 64 output tokens, no think time, sessions share nothing) as a trace; 8 sessions, a new one each second.
AGENTIC_8K = AgenticParams(sessions=8, rate_per_s=1.0, turns=(5, 5), system_prompts=1, system_tokens=0,
                           first_user_tokens=(3759, 5540), step_tokens=(827, 2608), output_tokens=(64, 64),
                           think_ms=(0.0, 0.0), max_input=40000, block=512, seed=8)
# The "64k in / 400 out / 90% reuse" agent with its lengths halved to fit a 40,960-token engine: 8 sessions of
# 6-10 turns behind 2 shared 20k system prompts, 2-4k first messages, 1-2.2k appended per turn, 300-500 output
# tokens, 0.5-3 s tool time; a new session every 2 s. At block 512: 59 requests, 30k tokens in and 390 out on
# average, 89% of input blocks seen before.
AGENTIC_64K_HALF = AgenticParams(sessions=8, rate_per_s=0.5, turns=(6, 10), system_prompts=2,
                                 system_tokens=20480, first_user_tokens=(2000, 4000), step_tokens=(1000, 2200),
                                 output_tokens=(300, 500), think_ms=(500.0, 3000.0), max_input=40000, block=512,
                                 seed=64)
# The CPU bed's 2,048-token engines: 3 sessions of 2-3 turns behind one 512-token system prompt, 16 output tokens.
CPU_TINY = AgenticParams(sessions=3, rate_per_s=1.0, turns=(2, 3), system_prompts=1, system_tokens=512,
                         first_user_tokens=(100, 400), step_tokens=(100, 300), output_tokens=(16, 16),
                         think_ms=(200.0, 600.0), max_input=1800, block=512, seed=3)
SHAPES = {"agentic-8k": AGENTIC_8K, "agentic-64k-half": AGENTIC_64K_HALF, "cpu-tiny": CPU_TINY}
SHAPES_HELP = ("FILE (Mooncake JSON lines, .gz too) or a generated shape: agentic-8k (the 8k agentic workload: "
               "8 sessions x 5 turns, 2-5u prompts with u=2374, 64 out), agentic-64k-half (64k in / 400 out / "
               "90%% reuse with lengths halved: 30k in, 390 out, 89%% reuse; 8 sessions x 6-10 turns, 20k shared "
               "system prompt, 1-2.2k new per turn, 0.5-3 s think), cpu-tiny (3 sessions x 2-3 turns, 512-token "
               "system prompt, under 1,800 tokens, 16 out); a shape's hash block is --trace-block")


def trace_of(name: str, block: int) -> list[TraceRequest]:
    """A trace file, or the generated shape of that name with hash blocks of `block` tokens."""
    if name in SHAPES:
        return agentic(dataclasses.replace(SHAPES[name], block=block))
    if not Path(name).is_file():
        raise SystemExit(f"--trace {name!r}: no such file and not one of {', '.join(SHAPES)}")
    return load(name)


class Blocks:
    """hash id -> the block of token ids it stands for (memoized: sessions repeat their prefixes). `salt` makes
    other blocks for the same ids (a replay on engines whose caches hold an earlier one's) from the first token."""

    def __init__(self, tokens: Tokens, block: int, salt: int = 0):
        special = set(tokens.tok.all_special_ids)
        self.vocab = [i for i in range(tokens.tok.vocab_size) if i not in special]
        self.block, self.salt = block, salt
        self.digits = next(d for d in range(1, 64) if len(self.vocab) ** d >= 1 << 63)
        self.memo: dict[int, tuple[int, ...]] = {}

    def __call__(self, hash_id: int) -> tuple[int, ...]:
        if hash_id not in self.memo:
            v, n, head = len(self.vocab), hash_id, []
            for _ in range(self.digits):
                n, d = divmod(n, v)
                head.append(self.vocab[(d + (0 if head else self.salt)) % v])  # the salt shifts the first digit
            rng = random.Random(f"{self.salt}:{hash_id}")
            self.memo[hash_id] = tuple(head) + tuple(rng.choice(self.vocab) for _ in range(self.block - len(head)))
        return self.memo[hash_id]


def to_requests(trace: list[TraceRequest], tokens: Tokens, block: int, salt: int = 0) -> list[Request]:
    """The harness's requests (workload "trace"), in trace order: token ids from the hash ids (Blocks),
    output_length as max_tokens, the timestamp as `at_s`, think_ms as `think_s`; a request without a session is
    a session of its own."""
    blocks, out = Blocks(tokens, block, salt), []
    for i, r in enumerate(trace):
        if not (len(r.hash_ids) - 1) * block < r.input_length <= len(r.hash_ids) * block:
            raise ValueError(f"trace request {i}: input_length {r.input_length} does not fit "
                             f"{len(r.hash_ids)} hash ids of {block} tokens (is --trace-block right?)")
        ids = tuple(t for h in r.hash_ids for t in blocks(h))[: r.input_length]
        out.append(Request("trace", r.session_id or f"req{i}", r.turn, ids, at_s=r.timestamp_ms / 1e3,
                           think_s=r.think_ms / 1e3, max_tokens=r.output_length))
    return out


def due_times(requests: list[Request], rate: float, seed: int = 0) -> list[float]:
    """Send times (s from the start, in request order) averaging `rate` requests per second: the trace's
    timestamps scaled, or Poisson arrivals when the timestamps carry no spacing."""
    at = [r.at_s for r in requests]
    assert rate > 0 and at == sorted(at), "requests in timestamp order, a positive rate"
    span = at[-1] - at[0]
    if len(at) < 2 or span <= 0:
        rng, t, out = random.Random(seed), 0.0, []
        for _ in at:
            out.append(t)
            t += rng.expovariate(rate)
        return out
    scale = (len(at) - 1) / rate / span
    return [(a - at[0]) * scale for a in at]


def open_loop(due: list[float], start: Callable[[int], None], clock: Callable[[], float] = time.monotonic,
              sleep: Callable[[float], None] = time.sleep) -> list[float]:
    """Call start(i) at due[i] s from now, in order, never waiting for an earlier one to finish (`start` must
    not block: it hands the request to a thread). -> how late each start was, in s (>= 0)."""
    t0, late = clock(), []
    for i, d in enumerate(due):
        wait = t0 + d - clock()
        if wait > 0:
            sleep(wait)
        late.append(max(0.0, clock() - t0 - d))
        start(i)
    return late


def closed_loop(requests: list[Request], conc: int, send: Callable[[Request], dict | None],
                sleep: Callable[[float], None] = time.sleep) -> list[dict]:
    """At most `conc` sessions at once, each session's turns in order, `think_s` before every turn but its
    first (after the previous answer). -> the rows `send` returned (None: no row), in the order they ended."""
    sessions: dict[str, list[Request]] = {}
    for r in requests:
        sessions.setdefault(r.session, []).append(r)
    todo, rows, lock = list(sessions.values()), [], threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if not todo:
                    return
                sess = todo.pop(0)
            for k, req in enumerate(sorted(sess, key=lambda r: r.turn)):
                if k and req.think_s > 0:
                    sleep(req.think_s)
                row = send(req)
                if row is not None:
                    with lock:
                        rows.append(row)

    threads = [threading.Thread(target=worker) for _ in range(conc)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return rows


def replay_open(requests: list[Request], rate: float, send: Callable[[Request], dict | None]) -> list[dict]:
    """Open loop at `rate`: each request's send(request) in a thread of its own at its due time. -> the rows
    `send` returned, in request order, each with `due_s` and `late_s` (how late its send went out)."""
    due, threads = due_times(requests, rate), []
    rows: list[dict | None] = [None] * len(requests)

    def one(i: int) -> None:
        rows[i] = send(requests[i])

    def start(i: int) -> None:
        threads.append(threading.Thread(target=one, args=(i,)))
        threads[-1].start()

    late = open_loop(due, start)
    for t in threads:
        t.join()
    return [row | {"due_s": d, "late_s": lt} for row, d, lt in zip(rows, due, late) if row is not None]
