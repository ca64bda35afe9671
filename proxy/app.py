"""The aiohttp application: routes, the error boundary, and the background tasks' lifecycle.

    build_app(config) -> web.Application            (tests run it in-process: see serve_in_background)

Every error a client can see leaves through `error_boundary`, OpenAI-shaped:
{"error": {"message", "type", "param", "code"}}.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import msgspec
from aiohttp import web

from .background import Background
from .config import ProxyConfig
from .errors import (BadRequest, NoHealthyWorker, Overloaded, ProxyError, UpstreamError, UpstreamStatus,
                     UpstreamTimeout, UpstreamUnavailable, error_bytes)
from .openai_api import Endpoint, parse_request
from .pd_flow import PDFlow
from .state import ProxyState

log = logging.getLogger("hybrid_pd.proxy")
STATE = web.AppKey("state", ProxyState)
MAX_BODY_BYTES = 64 * 1024 * 1024  # long-context prompts as text or token ids
_encoder = msgspec.json.Encoder()


def build_app(config: ProxyConfig) -> web.Application:
    state = ProxyState.build(config)
    app = web.Application(middlewares=[error_boundary], client_max_size=MAX_BODY_BYTES)
    app[STATE] = state
    flow = PDFlow(state)

    def generate(endpoint: Endpoint) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handler(request: web.Request) -> web.StreamResponse:
            req = parse_request(endpoint, await request.read())
            try:
                async with state.admission.slot():
                    return await flow.serve(request, req)
            except asyncio.CancelledError:
                state.metrics.errors.labels("client_disconnect").inc()
                raise
        return handler

    async def models(request: web.Request) -> web.Response:
        decoders = state.pool.admitted("decode")
        if not decoders:
            raise NoHealthyWorker("no healthy decode worker is admitted")
        payload = await state.upstream.get_json(decoders[0].url, "/v1/models", stage="models",
                                                timeout=config.timeouts.decode_first_byte_s)
        return web.Response(body=_encoder.encode(payload), content_type="application/json")

    async def health(request: web.Request) -> web.Response:
        counts = {role: len(state.pool.admitted(role)) for role in ("prefill", "decode")}
        ok = counts["decode"] > 0
        body = {"status": "ok" if ok else "no healthy decode worker", "admitted": counts,
                "ejected": [w.url for w in state.pool.all() if not w.healthy],
                "kv_hashes_verified": state.kv_index.hashes_verified}
        return web.Response(body=_encoder.encode(body), status=200 if ok else 503, content_type="application/json")

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=state.metrics.render(), headers={"Content-Type": "text/plain; version=0.0.4"})

    app.router.add_post("/v1/completions", generate("completions"))
    app.router.add_post("/v1/chat/completions", generate("chat"))
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.cleanup_ctx.append(_lifecycle)
    return app


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    state = app[STATE]
    await state.upstream.start()
    background = Background(state)
    await background.start()
    try:
        yield
    finally:
        await background.stop()
        await state.upstream.close()


@web.middleware
async def error_boundary(request: web.Request,
                         handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    metrics = request.app[STATE].metrics
    try:
        return await handler(request)
    except ProxyError as e:
        metrics.errors.labels(error_kind(e)).inc()
        if e.status >= 500:
            log.warning("%s %s -> %d: %s", request.method, request.path, e.status, e.message)
        return _error_response(e)
    except TimeoutError:
        e = UpstreamTimeout("the request did not finish within the total timeout (--total-timeout)")
        metrics.errors.labels("timeout").inc()
        return _error_response(e)
    except web.HTTPException as e:  # 404, 405, 413 from aiohttp itself: same shape as ours
        if e.status < 400:
            raise
        err = ProxyError(e.reason or "error")
        err.status, err.type = e.status, "invalid_request_error" if e.status < 500 else "internal_error"
        metrics.errors.labels("bad_request" if e.status < 500 else "internal").inc()
        return _error_response(err)
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception:  # the last line of defence: log it, fail this request, keep serving
        log.exception("internal error on %s %s", request.method, request.path)
        metrics.errors.labels("internal").inc()
        return _error_response(ProxyError("internal proxy error"))


def error_kind(e: ProxyError) -> str:
    if isinstance(e, UpstreamStatus):
        return "upstream_4xx" if e.is_client_error else "upstream_5xx"
    for cls, kind in ((BadRequest, "bad_request"), (Overloaded, "overloaded"), (NoHealthyWorker, "no_healthy_worker"),
                      (UpstreamTimeout, "timeout"), (UpstreamUnavailable, "unavailable"), (UpstreamError, "upstream")):
        if isinstance(e, cls):
            return kind
    return "internal"


def _error_response(e: ProxyError) -> web.Response:
    return web.Response(body=error_bytes(e), status=e.status, content_type="application/json")


@dataclass(frozen=True)
class RunningProxy:
    url: str
    app: web.Application

    @property
    def state(self) -> ProxyState:
        return self.app[STATE]


@contextlib.asynccontextmanager
async def serve_in_background(config: ProxyConfig) -> AsyncIterator[RunningProxy]:
    """Run the proxy in this event loop on config.host:config.port (0 = a free port); stops it on exit.
    Handlers are cancelled when their client disconnects (that is what aborts the decode leg)."""
    app = build_app(config)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield RunningProxy(f"http://{config.host}:{port}", app)
    finally:
        await runner.cleanup()
