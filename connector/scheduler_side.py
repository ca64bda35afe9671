"""The scheduler half of the connector, without vLLM imports (requests are duck-typed).

Prefill (P, producer): a request that asks for remote decode is cut one token short (D computes the last
prompt token itself, from the Mamba state after N-1 tokens); when it finishes, its blocks stay pinned
under a lease and its kv_transfer_params name them, per KV-cache group, plus the aligned Mamba checkpoint
at the last block boundary P holds (pinned too, if `checkpoints` can find it).
Decode (D, consumer): a request carrying P's params is matched for `remote_num_tokens` minus D's own hit,
loaded asynchronously; the plan is made once blocks are allocated. A request D will not read from (full
local hit, bad params, aborted before scheduling) is still announced to P so that P frees it.
Early decode (D): a request that carries a transfer key instead of P's params (the proxy sent it while P computes)
is not ready (`get_num_new_matched_tokens` answers None, vLLM asks again next step) until the proxy delivers P's
params for that key to the params inbox; then it loads as above. P failed, or no params within the wait's bound:
D computes the prompt itself (early_decode.py).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import msgspec

from hybrid_pd.connector.contract import (
    AWAIT_PREFILL,
    DECODER_KNOWS,
    PREFILL_STOP,
    SHIP_CHECKPOINT,
    STOP_BOUNDARY,
    STOP_LAST,
)
from hybrid_pd.connector.direct_delivery import Deliveries
from hybrid_pd.connector.early_decode import EarlyDecodes, OutcomeSource
from hybrid_pd.connector.errors import ConnectorError
from hybrid_pd.connector.integrity import digest_targets
from hybrid_pd.connector.messages import (
    BlockDigests,
    CheckpointRef,
    GroupDigests,
    RemotePrefill,
    parse_remote_prefill,
)
from hybrid_pd.connector.plan import NULL_BLOCK, Checkpoint, GroupSpec, plan_transfer
from hybrid_pd.connector.step import LoadJob, StepMeta

log = logging.getLogger("vllm." + __name__)  # under vLLM's configured logger
MARK_TRUNCATED = "_hybrid_pd_truncated"
MARK_JUNCTION = "_hybrid_pd_junction"  # P stopped at a junction: the state there crosses as a checkpoint too


class CheckpointStore(Protocol):
    """Access to the engine's prefix cache for Mamba checkpoints (implemented over vLLM's block pool)."""

    def pin(self, request: Any, group: int, tokens: int) -> tuple[int, int] | None:
        """P: pin the deepest cached checkpoint of `request` at or below `tokens`: (block id, boundary)."""

    def reserve(self, group: int) -> int | None:
        """D: take a free block to receive a checkpoint; None if the pool is short."""

    def register(self, request: Any, group: int, block_id: int, tokens: int) -> None:
        """D: enter a received checkpoint into the prefix cache under the request's block hash."""

    def keep(self, request: Any, group: int, block_id: int, tokens: int) -> None:
        """P: enter the request's own state block at `tokens` (where its prompt ends) into the prefix cache."""

    def release(self, block_ids: Sequence[int]) -> None:
        """Drop our reference to blocks pinned or reserved above."""


class SchedulerSide:
    def __init__(
        self,
        *,
        engine_id: str,
        host: str,
        port: int,
        groups: Sequence[GroupSpec],
        lease_s: float = 120.0,
        checkpoints: CheckpointStore | None = None,
        ship_checkpoints: bool = True,
        prefill_to_boundary: bool = True,
        engine_splits: bool = False,
        digests: bool = False,
        inbox: OutcomeSource | None = None,
        await_timeout_s: float = 120.0,
        idle_wait_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.engine_id, self.host, self.port = engine_id, host, port
        self.groups = list(groups)
        # P stops at a multiple of the aligned block of a model with Mamba groups (0: attention-only, N-1 tokens)
        self.aligned = math.lcm(*(g.block_size for g in groups)) if any(g.kind == "mamba" for g in groups) else 0
        self.boundary = self.aligned if prefill_to_boundary else 0  # where P stops unless the request says
        self.engine_splits = engine_splits  # align mode ends a step at a prompt's last boundary (P says so)
        self.lease_s = lease_s
        self.store = checkpoints
        self._ship = ship_checkpoints
        self._meta = StepMeta()
        self._pinned: dict[str, list[int]] = {}  # request id -> checkpoint blocks we hold
        self._landing: dict[str, tuple[Any, list[Checkpoint]]] = {}  # D: checkpoints to register on success
        self._loading: dict[str, tuple[Any, int]] = {}  # D: request id -> (request, its local hit) while it loads
        self.handshakes: list[bytes] = []  # P: each TP rank's encoded Handshake (from its worker at start-up)
        self.digests = digests  # P: have the workers digest each request's blocks (integrity.py)
        self._prefilling: dict[str, tuple[Any, list[list[int]]]] = {}  # P: request, its block ids so far
        self._steps: dict[str, int] = {}  # P: the engine steps each request it cut has taken so far
        self._awaiting: dict[str, dict] = {}  # P: kv_transfer_params returned this step, digests to come
        self.early = EarlyDecodes(inbox, await_timeout_s, idle_wait_s, clock)  # D: requests waiting for P's params
        self.direct = Deliveries()  # P: params pushed straight to an early decoder's inbox

    @property
    def ship_checkpoints(self) -> bool:
        return self._ship and self.store is not None

    @property
    def _store(self) -> CheckpointStore:
        assert self.store is not None, "checkpoints are pinned or reserved only when ship_checkpoints"
        return self.store

    # ---- P ----------------------------------------------------------------------------------------------
    def set_handshakes(self, by_rank: dict[int, bytes]) -> None:
        """P: the workers' handshakes, which every kv_transfer_params then carries (D then never waits on this
        engine's side channel). Ranks must be 0..n-1; anything else leaves D to ask the side channel."""
        if sorted(by_rank) != list(range(len(by_rank))):
            log.warning("handshakes of TP ranks %s: not carried, decoders will ask the side channel", sorted(by_rank))
            return
        self.handshakes = [by_rank[r] for r in range(len(by_rank))]

    def on_new_request(self, request: Any) -> int:
        """P: how many prompt tokens to compute (0: the request is not ours to cut). D computes the rest.

        With Mamba groups (align mode) P stops at the last block boundary below N by default on a CPU
        (connector/vllm_glue.py prefill_to_boundary): vLLM 0.26 would split a prefill that ends between
        boundaries into two engine steps (up to the boundary, so that the state there can be cached, then the
        tail), while D computes the tail (< one block) in the step it needs anyway for the last token. (vLLM
        0.32+ caches a state only below a prompt's last token, so it ends a step a block below a prompt cut at
        a boundary too: read in its scheduler.) The state D resumes from is then itself an aligned checkpoint:
        D caches it as its own and no separate checkpoint crosses, and P keeps it (_keep_own_state). Prompts
        shorter than a block, or attention-only models, keep the N-1 rule (D always computes the last token).
        The proxy may choose per request (PREFILL_STOP in its kv_transfer_params: "last" for N-1, when the
        decoder is busy and the tail's step would stall its streams; "boundary"; a token position, a junction
        where the next turn is expected to diverge: P stops at the aligned boundary at or below it, so that D
        holds the state there and computes the rest itself); without it, the engine's setting. Once per
        request, whatever preemption does; vllm_request.truncate_prompt does the cutting (vLLM's private token
        lists are the glue's to edit)."""
        params = request.kv_transfer_params
        if not params or not params.get("do_remote_decode") or params.get(MARK_TRUNCATED):
            return 0
        n = request.num_prompt_tokens
        if n < 2 or request.prompt_token_ids is None:
            return 0
        stop = params.get(PREFILL_STOP)
        if isinstance(stop, int) and not isinstance(stop, bool) and self.aligned and stop >= self.aligned:
            keep = min(stop, n - 1) // self.aligned * self.aligned  # a junction: the boundary at or below it
            params[MARK_JUNCTION] = True
        else:
            boundary = self.aligned if stop == STOP_BOUNDARY else 0 if stop == STOP_LAST else self.boundary
            keep = (n - 1) // boundary * boundary if boundary else 0
        request.max_tokens = 1
        params[MARK_TRUNCATED] = True
        self.direct.arrived(params)
        self._steps[request.request_id] = 0
        if self.digests:
            self._prefilling[request.request_id] = (request, [[] for _ in self.groups])
        return keep or n - 1

    def note_blocks(self, request_id: str, block_ids: Sequence[Sequence[int]], replace: bool) -> None:
        """P: blocks vLLM allocated to a request this step (all of them when `replace`: new or resumed)."""
        entry = self._prefilling.get(request_id)
        if entry is not None:
            lists = entry[1]
            for g, ids in enumerate(block_ids):
                lists[g] = list(ids) if replace else lists[g] + list(ids)

    def on_digests(self, by_request: dict[str, dict[int, list[GroupDigests]]], algorithm: str) -> None:
        """P: the workers' digests (request -> TP rank -> groups), computed in the step whose output finished
        the request: they join the kv_transfer_params that `request_finished` returned in that same output
        (vLLM sends them to the client only after the connector saw the step's output)."""
        for req_id, ranks in by_request.items():
            params = self._awaiting.pop(req_id, None)
            if params is not None and sorted(ranks) == list(range(len(ranks))):
                digests = BlockDigests(algorithm, [ranks[r] for r in range(len(ranks))])
                params["digests"] = msgspec.to_builtins(digests)
        self._awaiting.clear()  # digests come in the output that finished the request, or never

    def request_finished(
        self, request: Any, block_ids: Sequence[Sequence[int]], finished_ok: bool
    ) -> tuple[bool, dict | None]:
        params = request.kv_transfer_params
        if not params:
            return False, None
        self._loading.pop(request.request_id, None)
        self._prefilling.pop(request.request_id, None)
        steps = self._steps.pop(request.request_id, 0)
        if AWAIT_PREFILL in params:  # D: finished (aborted?) while it waited for P: P is told to free when it answers
            self.early.abandon(params)
            return False, None
        if params.get("do_remote_prefill"):  # D: finished (aborted?) before it ever read
            self._reject(request, "finished before the KV was read")
            return False, None
        if not params.get("do_remote_decode") or not finished_ok:
            return False, None
        num_tokens = request.num_computed_tokens
        if num_tokens <= 0 or not any(block_ids):
            return False, None
        refs = self._pin_checkpoints(request, num_tokens, block_ids)
        self._keep_own_state(request, num_tokens, block_ids)
        self._meta.leases[request.request_id] = self.lease_s
        # The proxy names the engine whose handshake the chosen decoder holds already: ours, then none is sent.
        handshakes = [] if params.get(DECODER_KNOWS) == self.engine_id else self.handshakes
        rp = RemotePrefill(
            remote_engine_id=self.engine_id,
            remote_request_id=request.request_id,
            remote_host=self.host,
            remote_port=self.port,
            remote_block_ids=[list(g) for g in block_ids],
            remote_num_tokens=num_tokens,
            lease_s=self.lease_s,
            checkpoints=refs,
            handshakes=handshakes,
            engine_splits=self.engine_splits,
            prefill_steps=steps,
        )
        out = rp.to_params()
        self._awaiting[request.request_id] = out
        self.direct.finished(request.request_id, params, out, final=not self.digests)
        return True, out

    def _pin_checkpoints(
        self, request: Any, num_tokens: int, block_ids: Sequence[Sequence[int]]
    ) -> list[CheckpointRef]:
        refs: list[CheckpointRef] = []
        if not self.ship_checkpoints or (request.kv_transfer_params or {}).get(SHIP_CHECKPOINT) is False:
            return refs  # (the proxy's policy never serves the next turn on D alone)
        # At a junction P's stop is a boundary D resumes from but would not keep (vLLM caches a prompt's state at
        # its last boundary only, and D's prompt goes on): the request's own state block there crosses a second
        # time, as a checkpoint for D to keep (P holds it for D's READ as it holds every block of the request).
        junction = bool((request.kv_transfer_params or {}).get(MARK_JUNCTION))
        for g, spec in enumerate(self.groups):
            boundary = num_tokens // spec.block_size * spec.block_size
            if spec.kind == "mamba" and junction and 0 < boundary == num_tokens:
                ids = block_ids[g] if g < len(block_ids) else []
                index = num_tokens // spec.block_size - 1
                if index < len(ids) and ids[index] != NULL_BLOCK:
                    refs.append(CheckpointRef(g, ids[index], num_tokens))
                continue
            if spec.kind != "mamba" or not 0 < boundary < num_tokens:
                continue
            pinned = self._store.pin(request, g, boundary)
            if pinned is not None:
                block, tokens = pinned
                refs.append(CheckpointRef(g, block, tokens))
                self._pinned.setdefault(request.request_id, []).append(block)
        return refs

    def _keep_own_state(self, request: Any, num_tokens: int, block_ids: Sequence[Sequence[int]]) -> None:
        """P stopped on a block boundary (the boundary stop, a junction, an aligned N-1): its state there is in the
        request's own block, where vLLM caches a state only a block below a prompt's last token. Kept in P's
        prefix cache, the conversation's next turn on P hits as deep in its Mamba groups as in attention, where
        it would otherwise recompute the last block and take a step more: vLLM stops a chunk where one group's
        hit runs past another's (the shared-prefix junction; vLLM 0.33 on an H200, Qwen3-Next shapes: 1.7-2.2x
        upstream's prefill on such a turn, benchmarks/results/2026-11-27-h200x2-qwen3next-judged-vllm033-r4)."""
        if self.store is None:
            return
        for g, spec in enumerate(self.groups):
            if spec.kind != "mamba" or num_tokens % spec.block_size:
                continue
            ids = block_ids[g] if g < len(block_ids) else []
            index = num_tokens // spec.block_size - 1
            if 0 <= index < len(ids) and ids[index] != NULL_BLOCK:
                self.store.keep(request, g, ids[index], num_tokens)

    # ---- D ----------------------------------------------------------------------------------------------
    @staticmethod
    def _remote(request: Any) -> RemotePrefill | None:
        params = request.kv_transfer_params
        if not params or not params.get("do_remote_prefill"):
            return None
        try:
            return parse_remote_prefill(params)
        except ConnectorError as e:
            log.warning("request %s: ignoring kv_transfer_params: %s", request.request_id, e)
            return None

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        params = request.kv_transfer_params
        if params and AWAIT_PREFILL in params and not self.early.verdict(request.request_id, params, self._meta):
            return None, False  # not ready: vLLM asks again next step
        remote = self._remote(request)
        if remote is None:
            return 0, False
        count = min(remote.remote_num_tokens, request.num_prompt_tokens) - num_computed_tokens
        return (count, True) if count > 0 else (0, False)

    def update_state_after_alloc(
        self, request: Any, block_ids: Sequence[Sequence[int]], num_external_tokens: int
    ) -> None:
        remote = self._remote(request)
        if remote is None:
            return
        request.kv_transfer_params["do_remote_prefill"] = False  # one transfer per request
        if num_external_tokens <= 0:
            self._meta.loads.append(LoadJob(request.request_id, remote, None, "decoder holds the prefix"))
            return
        num_tokens = min(remote.remote_num_tokens, request.num_prompt_tokens)
        hit = num_tokens - num_external_tokens
        landing = self._reserve_checkpoints(remote, hit, num_tokens)
        try:
            plan = plan_transfer(self.groups, remote.remote_block_ids, block_ids, num_tokens, hit, landing)
        except ConnectorError as e:  # the worker fails the request, vLLM recomputes it
            log.warning("request %s: no usable transfer plan: %s", request.request_id, e)
            self._release(landing)
            self._meta.loads.append(LoadJob(request.request_id, remote, None, f"no transfer plan: {e}", fail=True))
            return
        log.info(
            "request %s: load %d tokens from %s, local hit %d, %d blocks in %d runs, checkpoints %s",
            request.request_id,
            num_tokens,
            remote.remote_engine_id,
            hit,
            plan.num_blocks,
            len(plan.runs),
            [(c.tokens, c.local_block) for c in plan.checkpoints],
        )
        self._release([c for c in landing if c not in plan.checkpoints])
        if plan.checkpoints:
            self._landing[request.request_id] = (request, list(plan.checkpoints))
        self._loading[request.request_id] = (request, hit)
        self._meta.loads.append(LoadJob(request.request_id, remote, plan))

    def _release(self, checkpoints: Sequence[Checkpoint]) -> None:
        if checkpoints:
            self._store.release([c.local_block for c in checkpoints])

    def _reserve_checkpoints(self, remote: RemotePrefill, hit: int, num_tokens: int) -> list[Checkpoint]:
        out: list[Checkpoint] = []
        if not self.ship_checkpoints:
            return out
        for ref in remote.checkpoints:
            if hit < ref.tokens <= num_tokens and ref.group < len(self.groups):  # == : a junction's
                local = self._store.reserve(ref.group)
                if local is not None:
                    out.append(Checkpoint(ref.group, ref.block, local, ref.tokens))
        return out

    def _reject(self, request: Any, reason: str) -> None:
        remote = self._remote(request)
        if remote is not None:
            request.kv_transfer_params["do_remote_prefill"] = False
            self._meta.loads.append(LoadJob(request.request_id, remote, None, reason))

    def rewind_failed_loads(self, request_ids: set[str]) -> None:
        """D on vLLM < 0.32, whose only way to report a failed load is as finished: set each request back to
        its own local hit (the blocks before it are D's, cached and valid; the Mamba state at that boundary
        is a cached block the load never wrote), so vLLM computes the rest instead of decoding from blocks
        that never loaded."""
        for req_id in request_ids:
            request, hit = self._loading.get(req_id, (None, 0))
            if request is not None:
                log.warning("request %s: KV load failed; computing it from its local hit (%d tokens)", req_id, hit)
                request.num_computed_tokens = hit

    # ---- both -------------------------------------------------------------------------------------------
    def build_meta(self, scheduled_tokens: int = 1, per_request: dict[str, int] | None = None) -> StepMeta:
        """This step's work for the workers; `per_request`: the tokens vLLM scheduled per request id."""
        self.early.pump(scheduled_tokens == 0 and not self._loading, self._meta)
        meta, self._meta = self._meta, StepMeta()
        meta.idle = scheduled_tokens == 0 and bool(self._loading)
        self._awaiting.clear()  # a step's params got their digests in its own output, or get none
        self.direct.flush()  # (pushed at its output's end unless the step had no connector output)
        for req_id, n in (per_request or {}).items():
            if req_id in self._steps:
                self._steps[req_id] += 1
            entry = self._prefilling.get(req_id)
            if entry is not None and entry[0].num_computed_tokens + n >= entry[0].num_prompt_tokens:
                meta.digests[req_id] = digest_targets(entry[1])  # the prompt completes in this step
        return meta

    def on_transfer_results(
        self, finished_sending: set[str], finished_recving: set[str], failed_recving: set[str]
    ) -> None:
        for req_id in finished_sending:
            blocks = self._pinned.pop(req_id, None)
            if blocks:
                self._store.release(blocks)
        for req_id in finished_recving:
            self._loading.pop(req_id, None)
            request, checkpoints = self._landing.pop(req_id, (None, []))
            for cp in checkpoints:
                if req_id not in failed_recving:
                    try:
                        self._store.register(request, cp.group, cp.local_block, cp.tokens)
                    except ConnectorError as e:
                        log.warning("request %s: checkpoint not registered: %s", req_id, e)
                self._store.release([cp.local_block])
