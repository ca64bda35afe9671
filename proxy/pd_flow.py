"""One client request through the PD flow (ARCHITECTURE.md, "Data flow of one request"):

    1. tokenize (only when a policy or threshold needs token ids)
    2. pick the decoder D (decode-first: the decoder's cache decides where the turn lives)
    3. decide: remote prefill on P, or prefill on D (placement/decider.py)
    4. P: the body with max_tokens=1, stream=false, kv_transfer_params {do_remote_decode: true} (and, where
       the placement chose, where P stops: at the last aligned boundary or at N-1)
         -> P's kv_transfer_params. P's one sampled token is dropped: D samples the first token itself.
         5xx, timeout, unreachable, or no kv_transfer_params -> decode-only fallback; 4xx -> to the client
    5. D: the original body + P's kv_transfer_params; its answer (JSON or SSE) is relayed, cached_tokens fixed
   With --early-decode, 4 and 5 start together where D has a params inbox (early_decode.py): D gets the body with a
   transfer key at once, admits and tokenizes it while P computes, and P's outcome reaches D's inbox as P answers.

Everything one request carries between the steps is a `Turn` (turn.py). A client that leaves during step 4 leaves
P's call behind (an option of the upstream call): P's answer is read off its connection (or dropped at P's own
timeout), P counts as busy until then, and P's blocks are freed by its lease because no decoder will read them. A
client that leaves during step 5 closes D's connection, which aborts the request on D.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from typing import Any

from hybrid_pd.connector.contract import AWAIT_PREFILL, DECODER_KNOWS, DELIVER_TO, PREFILL_STOP, SHIP_CHECKPOINT

from .early_decode import EarlyDecode
from .errors import NoHealthyWorker, UpstreamError, UpstreamStatus, UpstreamTimeout, UpstreamUnavailable
from .handshakes import HandshakeMemo
from .http.request import Request
from .metrics import FlowRecorder
from .openai_api import OpenAIRequest
from .placement.decider import Decider
from .placement.disagg import is_remote
from .relay import relay_json, relay_sse
from .routing import RequestContext
from .state import ProxyState
from .timers import time_left
from .turn import FALLBACK, REMOTE_PREFILL, Turn
from .turn_tokens import TurnTokens
from .upstream import LeaveBehind
from .usage import breakdown, fix_usage, prefill_hit, reported_cached
from .workers import Role, Worker

log = logging.getLogger("hybrid_pd.proxy")
FORWARDED_HEADERS = ("authorization",)
# Request ids: unique across proxies and restarts (P and D match a transfer by it), without a uuid4 per request.
_ID_PREFIX = f"pd-{os.urandom(8).hex()}-"
_ids = itertools.count(1)


class PDFlow:
    def __init__(self, state: ProxyState):
        self.state = state
        self.config = state.config
        self.pool = state.pool
        self.upstream = state.upstream
        self.record = FlowRecorder(state.metrics)
        self.handshakes = HandshakeMemo()
        self.decider = Decider(state, self.record)
        self.tokens = TurnTokens(state, self.record)  # the prompt's ids, and where its last message starts
        self.early = EarlyDecode(self, self.handshakes, self.record, self.config.timeouts.prefill_s)  # --early-decode
        # The serving loop, bound at the first request; passed down rather than asked for (on Python 3.11 each
        # asyncio.get_running_loop() is a getpid system call: ten of them were 4% of the CPU per request).
        self.loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, request: Request, body: OpenAIRequest) -> None:
        """Run the flow for a parsed request and answer it; ProxyErrors propagate to the app's error boundary
        (when nothing was sent yet)."""
        started = time.perf_counter()
        received = request.headers
        headers = {}
        for k in FORWARDED_HEADERS:
            if k in received:
                headers[k] = received[k]
        headers["X-Request-Id"] = received.get("x-request-id") or f"{_ID_PREFIX}{next(_ids)}"
        context = RequestContext(
            session=received.get(self.config.routing.session_header) or body.user,
            token_ids=body.token_ids,
            cache_salt=_str_or_none(body.body.get("cache_salt")),
            hash_algo=self.config.kv.hash_algo,
            hash_seed=self.state.kv_index.seed,
            hash_cache=self.state.hash_cache,
        )
        loop = self.loop
        if loop is None:
            loop = self.loop = asyncio.get_running_loop()
        turn = Turn(request, body, context, headers, started, loop.time() + self.config.timeouts.total_s)
        if self.config.tokenize and context.token_ids is None and body.single_prompt:
            context.token_ids = body.token_ids = await self.tokens.ids(turn, loop)
        decoder = turn.decoder = self._pick("decode", context)
        decision = self.decider.decide(turn, decoder)
        self.record.decision(decision)
        if is_remote(decision) and self.config.disagg.early_decode and decoder.inbox:
            await self.early.serve(turn, decoder, loop)
            self.decider.misroute(turn, decoder, decision)
        else:
            if is_remote(decision):
                await self.prefill_step(turn, decoder)
            self.decider.misroute(turn, decoder, decision)
            await self.decode(turn, decoder)
        self.record.latency(body.endpoint, time.perf_counter() - started)
        self._log_pd_timing(turn)
        self.decider.learn(turn)

    async def prefill_step(self, turn: Turn, decoder: Worker) -> None:
        await self._prefill(turn)
        turn.prefill_answered = time.perf_counter()
        self.decider.learn_prefiller_call(turn)
        if turn.transfer_params is not None:
            turn.decoder_hit = turn.context.hits.get(decoder.url)

    # ---- steps --------------------------------------------------------------------------------------------
    def _time_left(self, turn: Turn) -> float:
        assert self.loop is not None
        return time_left(self.loop, turn.deadline)

    def _pick(self, role: Role, context: RequestContext, exclude: Worker | None = None) -> Worker:
        router = self.state.decode_router if role == "decode" else self.state.prefill_router
        workers = self.pool.admitted(role)
        if exclude is not None:
            workers = [w for w in workers if w is not exclude]
        worker = router.pick(context, workers)
        self.record.routed(role, router.label, worker.url)
        return worker

    async def _prefill(self, turn: Turn) -> None:
        """Sets the turn's transfer_params and prefill_hit, or falls back to decode-only on every P failure but
        4xx (raised). TimeoutError when the total deadline passes first."""
        try:
            prefiller = self._pick("prefill", turn.context)
        except NoHealthyWorker:
            return self.fallback(turn, "no_prefill_worker")
        if self._time_left(turn) <= 0:
            raise TimeoutError
        try:
            answer = await self._call_prefill(turn, prefiller)
        except UpstreamStatus as e:
            if e.is_client_error:
                raise
            return self.fallback(turn, f"prefill_{e.status // 100}xx")
        except UpstreamTimeout:
            if self._time_left(turn) <= 0:
                raise TimeoutError from None  # the total deadline, not P's own timeout
            return self.fallback(turn, "prefill_timeout")
        except UpstreamError:
            self._passive_eject(prefiller, "unreachable during prefill")
            return self.fallback(turn, "prefill_unavailable")
        params = answer.get("kv_transfer_params") if isinstance(answer, dict) else None
        if not isinstance(params, dict) or not params:
            return self.fallback(turn, "no_kv_transfer_params")
        self.handshakes.seen(prefiller.url, params)
        turn.mode, turn.transfer_params, turn.prefill_hit = REMOTE_PREFILL, params, prefill_hit(answer)
        turn.prefiller = prefiller
        if turn.prefill_hit is not None:
            self.record.hit("prefill_cached", turn.prefill_hit)
            predicted = turn.context.hits.get(prefiller.url) if turn.context.hits_known else None
            if predicted is not None and predicted > turn.prefill_hit:
                self.record.misprediction("prefill", predicted - turn.prefill_hit)

    async def _call_prefill(self, turn: Turn, prefiller: Worker) -> Any:
        """P's answer, awaited in the request's own task. Leaving early (the client went, or the total deadline
        passed) leaves P's call behind instead of cutting it: P finishes, its answer is read and its connection
        reused; its blocks wait for a decoder that will not come, until P's lease frees them. P counts as busy
        until then. P's own timeout (--prefill-timeout) drops the call."""
        assert self.loop is not None
        prefill_s = self.config.timeouts.prefill_s
        body = turn.body.prefill_body(self.config.kv.forward_token_ids)
        if turn.placement is not None and turn.placement.stop:  # where P stops: the placement's choice
            junction = await self.tokens.junction(turn) if turn.diverged else None
            body["kv_transfer_params"][PREFILL_STOP] = junction or turn.placement.stop
        elif self.config.disagg.prefiller_stop != "model":  # the peers' deciders: the stop --prefiller-stop names
            body["kv_transfer_params"][PREFILL_STOP] = self.config.disagg.prefiller_stop
        if self.config.disagg.pd_policy == "always-remote":  # no turn on D alone: no checkpoint for one to keep
            body["kv_transfer_params"][SHIP_CHECKPOINT] = False
        if turn.decoder is not None:
            known = self.handshakes.known_to(prefiller.url, turn.decoder.url, turn.decoder.identity)
            if known is not None:
                body["kv_transfer_params"][DECODER_KNOWS] = known
            if turn.early is not None and turn.decoder.inbox:  # P pushes its params there itself (direct_delivery)
                body["kv_transfer_params"][DELIVER_TO] = [turn.decoder.inbox, turn.early[AWAIT_PREFILL]]
        began = time.perf_counter()
        turn.prefill_alone = prefiller.in_flight == 0
        with self.pool.busy(prefiller, turn.context.uncached_on(self.state.deps, prefiller.url)) as busy:
            leave = LeaveBehind(self.loop.time() + prefill_s, busy.release)
            try:
                return await self.upstream.post_json(
                    prefiller.url,
                    turn.body.path,
                    body,
                    stage="prefill",
                    timeout=min(prefill_s, max(0.0, self._time_left(turn))),
                    headers=turn.headers,
                    leave_behind=leave,
                )
            except (asyncio.CancelledError, UpstreamTimeout) as e:
                if leave.taken and (isinstance(e, asyncio.CancelledError) or self._time_left(turn) <= 0):
                    self.record.abandoned_prefill()  # (P's own timeout drops the call at once: not abandoned)
                raise
            finally:
                if leave.taken:
                    busy.keep()  # until the answer left behind is read or dropped
                took = time.perf_counter() - began
                turn.prefill_ms = took * 1000
                turn.prefill_alone = turn.prefill_alone and prefiller.in_flight == 1
                self.record.stage("prefill", took)

    def fallback(self, turn: Turn, reason: str) -> None:
        log.info("remote prefill skipped: %s; serving decode-only", reason)
        self.record.fallback(reason)
        turn.mode = FALLBACK

    async def decode(self, turn: Turn, decoder: Worker) -> None:
        """D's answer relayed to the client. A decoder that cannot be reached before anything reached the client
        is ejected and the turn tried once more on another (any decoder can pull from P)."""
        if turn.decoder_hit:
            self.record.hit("decoder_local", turn.decoder_hit)
        began = time.perf_counter()
        for attempt in (0, 1):
            try:
                answered = await self._decode_on(turn, decoder)
                break
            except UpstreamUnavailable as e:
                self.handshakes.forget(decoder.url)
                self._passive_eject(decoder, str(e))
                if attempt or not any(w is not decoder for w in self.pool.admitted("decode")):
                    raise
                decoder = self._pick("decode", turn.context, exclude=decoder)
                if turn.prefill_task is not None:  # the early request never reached D: P's answer goes with
                    turn.early = None  # the request to the next decoder, in turn
                    await turn.prefill_task
        if answered is None:  # the client left mid-stream
            return
        status, usage = answered
        ended = time.perf_counter()
        self.record.stage("decode", ended - began)
        self.record.answered(turn.body.endpoint, turn.mode, status, usage)
        self._check_decoder_hit(turn, decoder)
        completion = usage.get("completion_tokens") if isinstance(usage, dict) else None
        if isinstance(completion, int) and status == 200:
            self.decider.observe_step(turn, completion, ended)

    async def _decode_on(self, turn: Turn, decoder: Worker) -> tuple[int, Any] | None:
        """One attempt on one decoder: (status, usage) of the answer relayed, or None where the client left
        mid-stream. UpstreamUnavailable where D could not be reached and nothing reached the client yet."""
        assert self.loop is not None
        endpoint, stream = turn.body.endpoint, turn.body.stream
        params, handshake_to = turn.transfer_params, None
        if turn.early is not None:  # P's params go to D's inbox once P answers (early_decode.py)
            params = turn.early
        elif params is not None:  # P's handshake only to a decoder that has not had it yet (handshakes.py)
            params, handshake_to = self.handshakes.params_for(params, decoder.url, decoder.identity)
        body = turn.body.decode_body(params, self.config.kv.forward_token_ids)
        remaining = max(0.001, turn.deadline - self.loop.time())
        # A JSON answer's headers come with its last byte; an SSE answer's right away (then its first line), which an
        # early decode sends after P's prefill
        first_byte_s = self.config.timeouts.decode_first_byte_s
        if turn.early is not None:
            first_byte_s += self.config.timeouts.prefill_s
        first_byte = min(first_byte_s, remaining) if stream else remaining
        split = self.config.disagg.usage_breakdown

        def fix(chunk: dict[str, Any]) -> int | None:
            if turn.transfer_params is None:  # D served it alone: its own figure is the truth
                turn.reported_hit = reported_cached(chunk)
                if split and turn.reported_hit is not None:
                    breakdown(chunk, None, turn.reported_hit, "decode")
                return None
            fixed = fix_usage(chunk, turn.prefill_hit, turn.decoder_hit)
            if split and fixed is not None:
                breakdown(chunk, turn.prefill_hit, turn.decoder_hit, "prefill")
            return fixed

        # a turn D serves alone queues its uncached prompt on D until its first token (what the next turn's
        # placement reads as D's queue: turns placed milliseconds apart see each other)
        local = turn.transfer_params is None and turn.early is None and turn.context.token_ids is not None
        busy = self.pool.busy(decoder, turn.context.uncached_on(self.state.deps, decoder.url) if local else 0)
        turn.decode_alone = local and decoder.streams == 0

        def first_byte_out() -> None:
            turn.first_byte = time.perf_counter()
            turn.decode_alone = turn.decode_alone and decoder.streams <= 1
            self.record.ttft(endpoint, turn.first_byte - turn.started)
            busy.prefilled()

        with busy:
            async with self.upstream.open_post(
                decoder.url, turn.body.path, body, stage="decode", first_byte_timeout=first_byte, headers=turn.headers
            ) as answer:
                if stream and answer.content_type == "text/event-stream":
                    result = await relay_sse(
                        turn.request,
                        answer,
                        fix,
                        worker=decoder.url,
                        first_byte_timeout=first_byte,
                        deadline=turn.deadline,
                        loop=self.loop,
                        on_first_byte=first_byte_out,
                    )
                    status, usage = result.status, result.usage
                    if result.broken is not None:
                        self.record.error(result.broken.kind)
                    if result.client_gone:
                        self.record.error("client_disconnect")
                        self.record.request(endpoint, turn.mode, "499")
                        return None
                else:
                    payload = await relay_json(
                        turn.request, answer, fix, worker=decoder.url, deadline=turn.deadline, loop=self.loop
                    )
                    status = answer.status
                    first_byte_out()
                    turn.first_byte = None  # a whole answer: its first byte is its last
                    usage = payload.get("usage") if isinstance(payload, dict) else None
        handshake_to = turn.handshake_to if turn.early is not None else handshake_to
        if handshake_to is not None and status < 400:
            self.handshakes.delivered(handshake_to)
        return status, usage

    def _log_pd_timing(self, turn: Turn) -> None:
        """--log-placement: each PD turn's P call and the time from P's answer to D's first byte, as the proxy saw
        them (what --early-decode shortens; benchmarks/early_decode.py reads these lines)."""
        if not self.config.disagg.log_placement or turn.prefill_answered is None or turn.first_byte is None:
            return
        log.info(
            "pd timing %s: early=%d mode=%s prefill_ms=%.2f after_prefill_ms=%.2f ttft_ms=%.2f",
            turn.headers["X-Request-Id"],
            turn.early is not None,
            turn.mode,
            turn.prefill_ms or 0.0,
            (turn.first_byte - turn.prefill_answered) * 1000,
            (turn.first_byte - turn.started) * 1000,
        )

    def _check_decoder_hit(self, turn: Turn, decoder: Worker) -> None:
        """Decoder-first: a turn D served alone completes there whatever D really holds (vLLM computes what it
        lacks). Where the index promised more than D's own cached_tokens, count the misprediction (events that
        lag, a gap, an eviction not seen yet) and the tokens D computed beyond the prediction."""
        if turn.transfer_params is not None or turn.reported_hit is None or not turn.context.hits_known:
            return
        predicted = turn.context.hits.get(decoder.url)
        if predicted is not None and predicted > turn.reported_hit:
            self.record.misprediction("decode", predicted - turn.reported_hit)

    def _passive_eject(self, worker: Worker, why: str) -> None:
        """A connection failure ejects at once when health checks run (they bring the worker back)."""
        if self.config.health.interval_s > 0:
            self.pool.eject(worker, why)
            self.record.worker_down(worker.role, worker.url)


def _str_or_none(v: Any) -> str | None:
    return v if isinstance(v, str) and v else None
