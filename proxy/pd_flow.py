"""One client request through the PD flow (ARCHITECTURE.md, "Data flow of one request"):

    1. tokenize (only when a policy or threshold needs token ids)
    2. pick the decoder D (decode-first: the decoder's cache decides where the turn lives)
    3. decide: remote prefill on P, or prefill on D (disagg.py)
    4. P: the body with max_tokens=1, stream=false, kv_transfer_params {do_remote_decode: true}
         -> P's kv_transfer_params. P's one sampled token is dropped: D samples the first token itself.
         5xx, timeout, unreachable, or no kv_transfer_params -> decode-only fallback; 4xx -> to the client
    5. D: the original body + P's kv_transfer_params; its answer (JSON or SSE) is relayed, cached_tokens fixed

A client that leaves during step 4 leaves P's call to finish alone: P's answer is read off its connection
(or dropped at P's own timeout), and P's blocks are freed by its lease because no decoder will
read them. A client that leaves during step 5 closes D's connection, which aborts the request on D.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from typing import Any

from .disagg import REMOTE, decide
from .errors import NoHealthyWorker, UpstreamError, UpstreamStatus, UpstreamTimeout, UpstreamUnavailable
from .http_request import Request
from .kv_index import aligned_block
from .openai_api import OpenAIRequest
from .relay import relay_json, relay_sse
from .routing import RequestContext
from .routing.kv_hit import hit_tokens
from .state import ProxyState
from .timers import time_left
from .upstream_response import Leave
from .usage import fix_usage, prefill_hit
from .workers import Worker

log = logging.getLogger("hybrid_pd.proxy")
FORWARDED_HEADERS = ("authorization",)
# Request ids: unique across proxies and restarts (P and D match a transfer by it), without a uuid4 per request.
_ID_PREFIX = f"pd-{os.urandom(8).hex()}-"
_ids = itertools.count(1)


class PDFlow:
    def __init__(self, state: ProxyState):
        self.s = state
        self.cfg = state.config
        self.m = state.metrics
        self.c = state.metrics.child  # cached labelled children
        # The serving loop, bound at the first request; passed down rather than asked for (on Python 3.11 each
        # asyncio.get_running_loop() is a getpid system call: ten of them were 4% of the CPU per request).
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]

    async def serve(self, request: Request, req: OpenAIRequest) -> None:
        """Run the flow for a parsed request and answer it; ProxyErrors propagate to the app's error boundary
        (when nothing was sent yet)."""
        t0 = time.perf_counter()
        headers = {k: request.headers[k] for k in FORWARDED_HEADERS if k in request.headers}
        headers["X-Request-Id"] = request.headers.get("x-request-id") or f"{_ID_PREFIX}{next(_ids)}"
        ctx = RequestContext(session=request.headers.get(self.cfg.routing.session_header) or req.user,
                             token_ids=req.token_ids, cache_salt=_str_or_none(req.body.get("cache_salt")),
                             hash_algo=self.cfg.kv.hash_algo, hash_seed=self.s.kv_index.seed)
        loop = self.loop
        if loop is None:
            loop = self.loop = asyncio.get_running_loop()
        deadline = loop.time() + self.cfg.timeouts.total_s  # every step below waits at most until then
        if self.cfg.tokenize and ctx.token_ids is None and req.single_prompt:
            ctx.token_ids = req.token_ids = await self._tokenize(req, headers, deadline)
        decoder = self._pick("decode", ctx)
        decision = decide(self.cfg.disagg, eligible=req.single_prompt,
                          has_prefillers=bool(self.s.pool.all("prefill")), prompt_chars=req.prompt_chars,
                          prompt_tokens=len(ctx.token_ids) if ctx.token_ids else None,
                          decoder_hit=self._decoder_hit(ctx, decoder),
                          aligned_block=aligned_block(self.s.kv_index.specs))
        self.c(self.m.disagg, decision).inc()
        ktp, p_hit, mode = None, None, "local_prefill"
        if decision == REMOTE:
            ktp, p_hit, mode = await self._prefill(req, ctx, headers, deadline)
        d_local = ctx.hits.get(decoder.url) if ktp is not None else None
        await self._decode(request, req, decoder, ktp, p_hit, d_local, headers, t0, mode, ctx, deadline)
        self.c(self.m.latency, req.endpoint).observe(time.perf_counter() - t0)

    # ---- steps --------------------------------------------------------------------------------------------
    async def _tokenize(self, req: OpenAIRequest, headers: dict[str, str], deadline: float) -> list[int] | None:
        body = req.tokenize_body()
        workers = self.s.pool.admitted("decode") or self.s.pool.admitted("prefill")
        if body is None or not workers:
            return None
        worker = workers[hash(headers["X-Request-Id"]) % len(workers)]
        t = time.perf_counter()
        try:
            timeout = min(self.cfg.timeouts.tokenize_s, time_left(self.loop, deadline))
            out = await self.s.upstream.post_json(worker.url, "/tokenize", body, timeout=timeout, stage="tokenize",
                                                  headers=headers)
        except UpstreamStatus as e:
            if e.is_client_error and req.endpoint == "chat":
                raise  # the chat template refused the messages: the client's request is at fault
            log.info("tokenize on %s failed (%s): routing without token ids", worker.url, e)
            return None
        except UpstreamError as e:
            log.info("tokenize on %s failed (%s): routing without token ids", worker.url, e)
            return None
        finally:
            self.c(self.m.stage_latency, "tokenize").observe(time.perf_counter() - t)
        tokens = out.get("tokens") if isinstance(out, dict) else None
        if isinstance(tokens, list) and all(isinstance(x, int) for x in tokens):
            return tokens
        return None

    def _pick(self, role: str, ctx: RequestContext, exclude: Worker | None = None) -> Worker:
        router = self.s.decode_router if role == "decode" else self.s.prefill_router
        workers = [w for w in self.s.pool.admitted(role) if w is not exclude]  # type: ignore[arg-type]
        worker = router.pick(ctx, workers)
        self.c(self.m.routing, role, router.label, worker.url).inc()
        return worker

    def _decoder_hit(self, ctx: RequestContext, decoder: Worker) -> int | None:
        if not ctx.token_ids or decoder.url not in self.s.kv_index.workers:
            return None
        return hit_tokens(self.s.deps, ctx, decoder)

    async def _prefill(self, req: OpenAIRequest, ctx: RequestContext, headers: dict[str, str],
                       deadline: float) -> tuple[dict[str, Any] | None, int | None, str]:
        """(P's kv_transfer_params, P's own hit, mode). Falls back to decode-only on every P failure but 4xx.
        TimeoutError when the total deadline passes first."""
        try:
            prefiller = self._pick("prefill", ctx)
        except NoHealthyWorker:
            return self._fallback("no_prefill_worker")
        if time_left(self.loop, deadline) <= 0:
            raise TimeoutError
        body = req.prefill_body(self.cfg.kv.forward_token_ids)
        try:
            resp = await self._call_prefill(prefiller, req, body, headers, deadline)
        except UpstreamStatus as e:
            if e.is_client_error:
                raise
            return self._fallback(f"prefill_{e.status // 100}xx")
        except UpstreamTimeout:
            if time_left(self.loop, deadline) <= 0:
                raise TimeoutError from None  # the total deadline, not P's own timeout
            return self._fallback("prefill_timeout")
        except UpstreamError:
            self._passive_eject(prefiller, "unreachable during prefill")
            return self._fallback("prefill_unavailable")
        ktp = resp.get("kv_transfer_params") if isinstance(resp, dict) else None
        if not isinstance(ktp, dict) or not ktp:
            return self._fallback("no_kv_transfer_params")
        p_hit = prefill_hit(resp)
        if p_hit is not None:
            self.c(self.m.hit_tokens, "prefill_cached").inc(p_hit)
        return ktp, p_hit, "remote_prefill"

    async def _call_prefill(self, prefiller: Worker, req: OpenAIRequest, body: dict[str, Any],
                            headers: dict[str, str], deadline: float) -> Any:
        """P's answer, awaited in the request's own task. Leaving early (the client went, or the total deadline
        passed) leaves P's call behind instead of cutting it: P finishes, its answer is read and its connection
        reused; its blocks wait for a decoder that will not come, until P's lease frees them. P counts as busy
        until then. P's own timeout (--prefill-timeout) drops the call."""
        loop, prefill_s = self.loop, self.cfg.timeouts.prefill_s
        t = time.perf_counter()
        prefiller.in_flight += 1
        leave = Leave(loop.time() + prefill_s, lambda: _not_busy(prefiller))
        try:
            return await self.s.upstream.post_json(prefiller.url, req.path, body, stage="prefill",
                                                   timeout=min(prefill_s, max(0.0, time_left(loop, deadline))),
                                                   headers=headers, leave=leave)
        except (asyncio.CancelledError, UpstreamTimeout) as e:
            if leave.taken and (isinstance(e, asyncio.CancelledError) or time_left(loop, deadline) <= 0):
                self.m.abandoned_prefills.inc()  # (P's own timeout drops the call at once: not abandoned)
            raise
        finally:
            if not leave.taken:
                prefiller.in_flight -= 1
            self.c(self.m.stage_latency, "prefill").observe(time.perf_counter() - t)

    def _fallback(self, reason: str) -> tuple[None, None, str]:
        log.info("remote prefill skipped: %s; serving decode-only", reason)
        self.c(self.m.fallbacks, reason).inc()
        return None, None, "fallback"

    async def _decode(self, request: Request, req: OpenAIRequest, decoder: Worker, ktp: dict[str, Any] | None,
                      p_hit: int | None, d_local: int | None, headers: dict[str, str], t0: float, mode: str,
                      ctx: RequestContext, deadline: float) -> None:
        body = req.decode_body(ktp, self.cfg.kv.forward_token_ids)
        if d_local:
            self.c(self.m.hit_tokens, "decoder_local").inc(d_local)

        def fix(chunk: dict[str, Any]) -> int | None:
            return fix_usage(chunk, p_hit, d_local) if ktp is not None else None

        loop = self.loop
        t = time.perf_counter()
        for attempt in (0, 1):
            remaining = max(0.001, deadline - loop.time())
            # A JSON answer's headers come with its last byte; an SSE answer's right away (then its first line)
            first_byte = min(self.cfg.timeouts.decode_first_byte_s, remaining) if req.stream else remaining
            try:
                with self.s.pool.busy(decoder):
                    async with self.s.upstream.open_post(decoder.url, req.path, body, stage="decode",
                                                         first_byte_timeout=first_byte, headers=headers) as resp:
                        if req.stream and resp.content_type == "text/event-stream":
                            def ttft() -> None:
                                self.c(self.m.ttft, req.endpoint).observe(time.perf_counter() - t0)

                            result = await relay_sse(
                                request, resp, fix, worker=decoder.url, first_byte_timeout=first_byte,
                                deadline=deadline, loop=loop, on_first_byte=ttft)
                            status, usage = result.status, result.usage
                            if result.broken is not None:
                                self.c(self.m.errors, result.broken.kind).inc()
                            if result.client_gone:
                                self.c(self.m.errors, "client_disconnect").inc()
                                self.c(self.m.requests, req.endpoint, mode, "499").inc()
                                return
                        else:
                            payload = await relay_json(request, resp, fix, worker=decoder.url, deadline=deadline,
                                                       loop=loop)
                            status = resp.status
                            self.c(self.m.ttft, req.endpoint).observe(time.perf_counter() - t0)
                            usage = payload.get("usage") if isinstance(payload, dict) else None
                break
            except UpstreamUnavailable as e:
                # Nothing reached the client yet: one more decoder may serve it (any decoder can pull from P).
                self._passive_eject(decoder, str(e))
                if attempt or not any(w is not decoder for w in self.s.pool.admitted("decode")):
                    raise
                decoder = self._pick("decode", ctx, exclude=decoder)
        self.c(self.m.stage_latency, "decode").observe(time.perf_counter() - t)
        self._count(req, mode, status, usage)

    def _count(self, req: OpenAIRequest, mode: str, status: int, usage: Any) -> None:
        self.c(self.m.requests, req.endpoint, mode, str(status)).inc()
        if isinstance(usage, dict):
            if isinstance(usage.get("prompt_tokens"), int):
                self.m.prompt_tokens.inc(usage["prompt_tokens"])
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
                self.c(self.m.hit_tokens, "reported_cached").inc(details["cached_tokens"])

    def _passive_eject(self, worker: Worker, why: str) -> None:
        """A connection failure ejects at once when health checks run (they bring the worker back)."""
        if self.cfg.health.interval_s > 0:
            self.s.pool.eject(worker, why)
            self.m.worker_healthy.labels(worker.role, worker.url).set(0)


def _not_busy(worker: Worker) -> None:
    worker.in_flight -= 1


def _str_or_none(v: Any) -> str | None:
    return v if isinstance(v, str) and v else None
