"""One simulated vLLM engine: continuous batching in steps, an align-mode prefix cache with LRU eviction, and the
KV events it would publish.

Step cost (fleetsim_model.CostModel): a step in which some request computes more than one token runs vLLM's eager
prefill path, `s0 + s1 * tokens + s2 * tokens * context + s3 * (prefilling - 1) + d1 * decoding`; a step where
every request computes one token (decode, or a 1-token prefill tail) runs the decode graphs, `d0 + d1 * requests`.
Decode-only stretches are advanced as spans of equal steps (one event, not one per token) and cut at the next
step's end when work arrives.

Prefill in align mode: a prefill of tokens [h, end) runs in chunks that end on block boundaries (at most
`max_batched` tokens each), then the tail past the last boundary as a step of its own. The cache keeps attention
blocks (full blocks of the prompt) and Mamba checkpoints only where a step ended on a block boundary; a usable
hit of N tokens needs every attention block below N and a checkpoint at N. Both live in one LRU pool of pages
(a checkpoint costs `ckpt_pages`, an attention block 1); blocks of requests still running are touched when they
finish, so they are the last to go. Generated tokens are not cached (an agent's next prompt holds the answer,
but past the prompt's last checkpoint it could not be a hybrid hit anyway).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable

from proxy.kv.events import BlockRemoved, BlockStored

ATTN, MAMBA = 0, 1  # the KV-event groups the simulated engines publish (full_attention, mamba)


class Cache:
    """One engine's prefix cache: (group, key) -> None in LRU order; keys are the trace's block hash ids."""

    def __init__(self, capacity_pages: int, block: int, ckpt_pages: int, publish: Callable[[list], None] | None):
        self.capacity, self.block, self.ckpt_pages = capacity_pages, block, ckpt_pages
        self.pages = 0
        self.lru: OrderedDict[tuple[int, int], None] = OrderedDict()
        self.publish = publish  # KV events -> the proxy's index (None: nobody listens)

    def hit(self, keys: list[int], num_tokens: int) -> int:
        """The engine's own usable hit: attention prefix AND a checkpoint at its end, below the last token."""
        lru, b = self.lru, self.block
        limit = min((num_tokens - 1) // b, len(keys))
        a = 0
        while a < limit and (ATTN, keys[a]) in lru:
            a += 1
        for j in range(a, 0, -1):
            if (MAMBA, keys[j - 1]) in lru:
                return j * b
        return 0

    def store(self, keys: list[int], upto_blocks: int, checkpoints: list[int]) -> None:
        """Attention blocks [0, upto_blocks) and checkpoints at the given block counts are now cached (touched)."""
        lru, new_attn, new_ckpt = self.lru, [], []
        for j in range(min(upto_blocks, len(keys))):
            k = (ATTN, keys[j])
            if k in lru:
                lru.move_to_end(k)
            else:
                lru[k] = None
                new_attn.append(keys[j])
                self.pages += 1
        for j in checkpoints:
            if 0 < j <= len(keys):
                k = (MAMBA, keys[j - 1])
                if k in lru:
                    lru.move_to_end(k)
                else:
                    lru[k] = None
                    new_ckpt.append(keys[j - 1])
                    self.pages += self.ckpt_pages
        removed = self._evict()
        if self.publish is not None and (new_attn or new_ckpt or removed[0] or removed[1]):
            events: list = []
            if removed[ATTN]:
                events.append(BlockRemoved(removed[ATTN], group_idx=ATTN))
            if removed[MAMBA]:
                events.append(BlockRemoved(removed[MAMBA], group_idx=MAMBA))
            events.append(
                BlockStored(new_attn, None, [], self.block, group_idx=ATTN, kv_cache_spec_kind="full_attention")
            )
            events.append(BlockStored(new_ckpt, None, [], self.block, group_idx=MAMBA, kv_cache_spec_kind="mamba"))
            self.publish(events)

    def touch(self, keys: list[int], upto_blocks: int) -> None:
        lru = self.lru
        for j in range(min(upto_blocks, len(keys))):
            k = (ATTN, keys[j])
            if k in lru:
                lru.move_to_end(k)

    def _evict(self) -> tuple[list[int], list[int]]:
        out: tuple[list[int], list[int]] = ([], [])
        lru = self.lru
        while self.pages > self.capacity and lru:
            (g, key), _ = lru.popitem(last=False)
            self.pages -= 1 if g == ATTN else self.ckpt_pages
            out[g].append(key)
        return out


class Job:
    """A request's work on one engine: prefill chunks (tokens, context before them), then `decode` tokens."""

    __slots__ = ("chunks", "decode", "on_first", "on_done", "tag")

    def __init__(
        self,
        chunks: list[tuple[int, int]],
        decode: int,
        on_first: Callable[[float], None] | None,
        on_done: Callable[[float], None] | None,
        tag: object = None,
    ):
        self.chunks, self.decode, self.on_first, self.on_done, self.tag = deque(chunks), decode, on_first, on_done, tag


def chunks_of(
    start: int, end: int, block: int, max_batched: int, boundary_checkpoints: bool = True
) -> list[tuple[int, int]]:
    """Align mode's prefill steps for tokens [start, end): chunks ending on block boundaries, then the tail.
    Returns (tokens, context) per step."""
    if end <= start:
        return []
    out = []
    last = end // block * block
    pos = start
    step = max(block, max_batched // block * block)
    while pos < last:
        nxt = min(last, (pos // block * block) + step)
        out.append((nxt - pos, pos))
        pos = nxt
    if pos < end:
        out.append((end - pos, pos))
    return out


class Engine:
    """Continuous batching: each step carries one token per decoding request and as many whole prefill chunks as
    the token budget and the sequence limit allow, first come first served."""

    def __init__(self, name: str, sim, cost, cache: Cache, max_batched: int, max_seqs: int):
        self.name, self.sim, self.cost, self.cache = name, sim, cost, cache
        self.max_batched, self.max_seqs = max_batched, max_seqs
        self.waiting: deque[Job] = deque()
        self.running: list[Job] = []
        self.prefilling: list[Job] = []  # admitted, chunks left
        self.busy = False
        self.version = 0
        self.span: tuple[float, float, int] | None = None  # (start, step time, steps) of a decode-only span
        self.step_jobs: list[Job] = []
        self.busy_s = 0.0

    def submit(self, job: Job) -> None:
        self.waiting.append(job)
        if not self.busy:
            self._next(self.sim.now)
        elif self.span is not None:
            self._cut_span(self.sim.now)

    def load(self) -> int:
        return len(self.running) + len(self.prefilling) + len(self.waiting)

    # ---- stepping -------------------------------------------------------------------------------------------
    def _cut_span(self, now: float) -> None:
        start, t, steps = self.span  # type: ignore[misc]
        done = min(steps - 1, int((now - start) / t))  # the step under way ends at start + (done + 1) t
        if done + 1 >= steps:
            return
        self.span = (start, t, done + 1)
        self.busy_s -= t * (steps - done - 1)
        self.version += 1
        self.sim.at(start + (done + 1) * t, self._end_span, self.version)

    def _next(self, now: float) -> None:
        while self.waiting and len(self.running) + len(self.prefilling) < self.max_seqs:
            self.prefilling.append(self.waiting.popleft())
        n_dec = len(self.running)
        budget = self.max_batched - n_dec
        picked, tokens, ctx_work, eager = [], 0, 0.0, False
        block = self.cache.block
        for job in self.prefilling:
            c, ctx = job.chunks[0]
            room = budget - tokens
            if c > room and picked:
                part = room // block * block  # vLLM's chunked prefill: what fits, cut at a block boundary
                if part < block:
                    break
                job.chunks[0] = (c - part, ctx + part)
                job.chunks.appendleft((part, ctx))
                c = part
            picked.append(job)
            tokens += c
            ctx_work += c * (ctx + c / 2)
            eager = eager or c > 1
        if picked:
            cost = self.cost
            if eager:
                t = cost.s0 + cost.s1 * tokens + cost.s2 * ctx_work + cost.s3 * (len(picked) - 1) + cost.d1 * n_dec
            else:
                t = cost.d0 + cost.d1 * (n_dec + len(picked))
            self.busy, self.span, self.step_jobs = True, None, picked
            self.version += 1
            self.busy_s += t
            self.sim.at(now + t, self._end_step, self.version)
        elif self.running:
            steps = min(j.decode for j in self.running)
            t = self.cost.d0 + self.cost.d1 * n_dec
            self.busy, self.span = True, (now, t, steps)
            self.busy_s += t * steps
            self.version += 1
            self.sim.at(now + t * steps, self._end_span, self.version)
        else:
            self.busy, self.span = False, None

    def _end_step(self, now: float, version: int) -> None:
        if version != self.version:
            return
        for job in self.running:
            job.decode -= 1
        self._finish_decoded(now)
        for job in self.step_jobs:
            job.chunks.popleft()
            if not job.chunks:
                self.prefilling.remove(job)
                if job.on_first is not None:
                    job.on_first(now)
                job.decode -= 1  # the prefill's last step samples the first token
                if job.decode > 0:
                    self.running.append(job)
                elif job.on_done is not None:
                    job.on_done(now)
        self.step_jobs = []
        self._next(now)

    def _end_span(self, now: float, version: int) -> None:
        if version != self.version:
            return
        _, _, steps = self.span  # type: ignore[misc]
        for job in self.running:
            job.decode -= steps
        self._finish_decoded(now)
        self._next(now)

    def _finish_decoded(self, now: float) -> None:
        if any(j.decode <= 0 for j in self.running):
            done = [j for j in self.running if j.decode <= 0]
            self.running = [j for j in self.running if j.decode > 0]
            for j in done:
                if j.on_done is not None:
                    j.on_done(now)
