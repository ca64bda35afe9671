"""The fleet simulator's event loop and its proxy: each request is routed by the proxy's own code, and engines
(fleetsim_engine) compute it.

One request, as pd_flow.py serves it:

    arrival -> Router("decode").pick (proxy/routing, over the real KVIndex fed by the engines' simulated KV events)
            -> placement (proxy.placement.disagg.decide for ours) -> remote: Router("prefill").pick
    remote:  +p_hop/2 -> P's queue and prefill (to the block boundary, or N-1 tokens as the measured runs did)
             -> +p_hop/2 + READ (bytes of the blocks D lacks) + D's poll -> D computes the rest, samples
    local:   D's queue and prefill
    first token + front (proxy and HTTP) = TTFT; then D decodes the answer in its batch.

The KV events are vLLM's structs (proxy/kv/events.py) applied with KVIndex.apply; a prompt's keys are the trace's
hash ids (no tokens to hash: the index's PromptKeys is given them), its token ids a range of its length.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from proxy.config.sections import DisaggConfig, KVIndexConfig
from proxy.kv.events import KVEventBatch
from proxy.kv.index import KVIndex
from proxy.kv.prompt_keys import PromptKeys
from proxy.routing import Deps, RequestContext, Router
from proxy.usage import whole_request_cached_tokens
from proxy.workers import Worker

from .fleetsim_engine import ATTN, Cache, Engine, Job, chunks_of
from .fleetsim_model import CostModel
from .fleetsim_policies import PLACEMENTS, PlacementInput, PolicySpec, Prefiller
from .fleetsim_trace import TraceRequest


@dataclass
class Result:
    req: TraceRequest
    arrival: float
    remote: bool = False
    hit: int = 0  # prompt tokens the computing engine (P, or D when local) found cached: compute saved
    reported: int = 0  # cached tokens as the proxy reports them (usage.py: max of P's and D's own)
    oracle: int = 0  # the longest prefix any earlier request computed (block-rounded): the best any routing could do
    ttft: float | None = None
    e2e: float | None = None
    read_bytes: float = 0.0


@dataclass(frozen=True)
class FleetConfig:
    prefillers: int
    decoders: int
    cache_tokens: int = 2_000_000  # per engine
    ckpt_pages: int = 3  # pages a Mamba checkpoint takes next to one attention block's (Qwen3-Next: 3 GDN groups)
    p_to_boundary: bool = True  # P stops at the last block boundary (today's connector); False: N-1 tokens
    disagg: DisaggConfig = field(default_factory=DisaggConfig)


class Sim:
    def __init__(self, cost: CostModel, fleet: FleetConfig, policy: PolicySpec):
        self.now = 0.0
        self._heap: list = []
        self._seq = itertools.count()
        self.cost, self.fleet, self.policy, self.block = cost, fleet, policy, cost.block
        self.index = KVIndex(grace_s=0)
        self.index.hashes_verified = True  # the simulated hashes are the keys themselves
        self.deps = Deps(self.index, KVIndexConfig(hash_block_size=cost.block))
        self.decode_router = Router("decode", policy.decode, self.deps)
        self.prefill_router = Router("prefill", policy.prefill, self.deps)
        self.place = PLACEMENTS[policy.placement](fleet.disagg)
        pages = fleet.cache_tokens // cost.block
        self.workers: dict[str, tuple[Worker, Engine]] = {}
        for role, n in (("prefill", fleet.prefillers), ("decode", fleet.decoders)):
            for i in range(n):
                url = f"http://{role[0]}{i}"
                w = Worker(url, role)  # type: ignore[arg-type]
                cache = Cache(pages, cost.block, fleet.ckpt_pages, self._publisher(url))
                self.workers[url] = (w, Engine(url, self, cost, cache, cost.max_batched, cost.max_seqs))
                self.index.of(url)
        self.prefill = [w for w, _ in self.workers.values() if w.role == "prefill"]
        self.decode = [w for w, _ in self.workers.values() if w.role == "decode"]
        self.results: list[Result] = []
        self.seen: set[int] = set()  # every block key any engine computed (the oracle)
        self.on_done: Callable[[Result], None] | None = None

    # ---- events ---------------------------------------------------------------------------------------------
    def at(self, t: float, fn: Callable, *args) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), fn, args))

    def run(self) -> None:
        heap = self._heap
        while heap:
            t, _, fn, args = heapq.heappop(heap)
            self.now = t
            fn(t, *args)

    def _publisher(self, url: str) -> Callable[[list], None]:
        hybrid, index = self.policy.hybrid_index, self.index

        def publish(events: list) -> None:
            if not hybrid:  # a router blind to the hybrid rule: it sees the attention group only
                events = [e for e in events if (e.group_idx or 0) == ATTN]
            index.apply(url, KVEventBatch(self.now, events))

        return publish

    # ---- the proxy ------------------------------------------------------------------------------------------
    def submit(self, req: TraceRequest, t: float) -> None:
        self.at(t, self._arrive, req)

    def _arrive(self, now: float, req: TraceRequest) -> None:
        b, n = self.block, req.input_length
        keys = req.hash_ids[: n // b]
        res = Result(req, now)
        j = 0
        while j < len(keys) and keys[j] in self.seen:
            j += 1
        res.oracle = min(j * b, (n - 1) // b * b)
        ctx = RequestContext(session=req.session_id or None, token_ids=range(n))  # type: ignore[arg-type]
        given = PromptKeys((), b)
        given.keys, given.total = keys, len(keys)
        ctx._keys[b] = given
        d = self.decode_router.pick(ctx, self.decode)
        d_hit = ctx.hit_on(self.deps, d.url)
        views = tuple(
            Prefiller(p.url, ctx.hit_on(self.deps, p.url), p.in_flight, p.queued_tokens) for p in self.prefill
        )
        p_hit = max((v.hit for v in views), default=0)
        choice = self.place(PlacementInput(n, d_hit, p_hit, round(d.load), b, d.url, views)) if views else False
        res.remote = choice is not False
        d.in_flight += 1
        d_engine = self.workers[d.url][1]
        cost = self.cost
        if not res.remote:
            start = d_engine.cache.hit(keys, n)
            res.hit = res.reported = start
            ch = chunks_of(start, n, b, cost.max_batched)

            def local_first(t: float) -> None:
                res.ttft = t + cost.front_local - res.arrival
                d_engine.cache.store(keys, n // b, [x // b for x in ends_on_boundary(ch, b)])

            d_engine.submit(Job(ch, req.output_length, local_first, lambda t: self._finish(t, res, d)))
            self.seen.update(keys)
            return
        p = self.workers[choice][0] if isinstance(choice, str) else self.prefill_router.pick(ctx, self.prefill)
        p_engine = self.workers[p.url][1]
        start = p_engine.cache.hit(keys, n)
        res.hit, res.reported = start, whole_request_cached_tokens(start, d_engine.cache.hit(keys, n), n)
        end = (n - 1) // b * b if self.fleet.p_to_boundary else n - 1
        ch = chunks_of(start, end, b, cost.max_batched) or [(1, max(0, end - 1))]  # at least one step
        queued = n - ctx.hit_on(self.deps, p.url)
        p.in_flight += 1
        p.queued_tokens += queued
        boundary = (n - 1) // b * b

        def p_done(t: float) -> None:
            p.in_flight -= 1
            p.queued_tokens -= queued
            p_engine.cache.store(keys, end // b, [x // b for x in ends_on_boundary(ch, b)] + [boundary // b])
            have = d_engine.cache.hit(keys, n)
            blocks = max(0, -(-end // b) - have // b)
            res.read_bytes = blocks * cost.bytes_per_block
            read = cost.read0 + res.read_bytes / cost.read_bw
            self.at(t + cost.p_hop / 2 + read + cost.read_poll, d_start)

        def d_start(t: float) -> None:
            def first(t1: float) -> None:
                res.ttft = t1 + cost.front - res.arrival
                d_engine.cache.store(keys, n // b, [boundary // b])

            d_engine.submit(
                Job(
                    [(n - boundary if self.fleet.p_to_boundary else 1, boundary)],
                    req.output_length,
                    first,
                    lambda t2: self._finish(t2, res, d),
                )
            )

        self.at(now + cost.p_hop / 2, lambda t: p_engine.submit(Job(ch, 1, None, p_done)))
        self.seen.update(keys)

    def _finish(self, now: float, res: Result, d: Worker) -> None:
        d.in_flight -= 1
        res.e2e = now + self.cost.front - res.arrival
        self.results.append(res)
        if self.on_done is not None:
            self.on_done(res)


def ends_on_boundary(chunks: list[tuple[int, int]], block: int) -> list[int]:
    """The token positions where these prefill steps end on a block boundary (align mode keeps a checkpoint)."""
    return [ctx + c for c, ctx in chunks if (ctx + c) % block == 0]


class ClosedLoop:
    """Sessions sent turn after turn, each turn `think_ms` after the previous one's last token, at most `slots`
    sessions at once (the GPU benchmark's client: `concurrency` threads taking sessions from a queue); without
    `slots`, each session starts at its first turn's timestamp."""

    def __init__(self, sim: Sim, requests: list[TraceRequest], slots: int | None = None):
        self.sim = sim
        by: dict[str, list[TraceRequest]] = {}
        for r in requests:
            by.setdefault(r.session_id or f"_{id(r)}", []).append(r)
        self.sessions = [sorted(v, key=lambda r: r.turn) for v in by.values()]
        self.sessions.sort(key=lambda s: s[0].timestamp_ms)
        self.next_turn: dict[str, list[TraceRequest]] = {}
        sim.on_done = self._done
        if slots:
            self.queue = list(reversed(self.sessions))
            for _ in range(min(slots, len(self.queue))):
                self._start(self.queue.pop(), 0.0)
        else:
            self.queue = []
            for s in self.sessions:
                self._start(s, s[0].timestamp_ms / 1e3)

    def _start(self, turns: list[TraceRequest], t: float) -> None:
        self.next_turn[turns[0].session_id or f"_{id(turns[0])}"] = turns[1:]
        self.sim.submit(turns[0], t)

    def _done(self, res: Result) -> None:
        key = res.req.session_id or f"_{id(res.req)}"
        rest = self.next_turn.get(key) or []
        if rest:
            self.next_turn[key] = rest[1:]
            self.sim.submit(rest[0], self.sim.now + rest[0].think_ms / 1e3)
        elif self.queue:
            self._start(self.queue.pop(), self.sim.now)
