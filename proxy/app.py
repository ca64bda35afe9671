"""The proxy's routes, the error boundary, and the background tasks' lifecycle, on http/server.py's HTTPServer.

    async with serve_in_background(config) as proxy: ...     (server.py runs it until a signal; tests in-process)
        await proxy.drain()                                      (SIGTERM: readiness off, serve on, then stop)

/health is readiness (503 without an admitted decoder, while the proxy's tokenizer loads, and while draining);
/livez is liveness (200 while the event loop runs, whatever the workers do).

Every error a client can see leaves through `ProxyApp.handle`, OpenAI-shaped:
{"error": {"message", "type", "param", "code"}}.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import msgspec

from .background import Background
from .config import ProxyConfig
from .errors import MethodNotAllowed, NoHealthyWorker, NotFound, ProxyError, UpstreamTimeout, error_bytes
from .http.request import Request
from .http.server import HTTPServer, Limits
from .openai_api import Endpoint, check_content_type, parse_request
from .pd_flow import PDFlow
from .state import ProxyState

log = logging.getLogger("hybrid_pd.proxy")
_encoder = msgspec.json.Encoder()
Route = Callable[[Request], Awaitable[None]]


class ProxyApp:
    def __init__(self, config: ProxyConfig):
        self.config = config
        self.state = ProxyState.build(config)
        self.flow = PDFlow(self.state)
        self.draining = False  # SIGTERM came: /health answers 503 so that the Service stops sending
        self.routes: dict[str, dict[str, Route]] = {
            "/v1/completions": {"POST": self._generate("completions")},
            "/v1/chat/completions": {"POST": self._generate("chat")},
            "/v1/models": {"GET": self.models},
            "/health": {"GET": self.health},
            "/livez": {"GET": self.livez},
            "/metrics": {"GET": self.metrics},
        }

    async def handle(self, request: Request) -> None:
        """Route a request; answer every error OpenAI-shaped (the boundary)."""
        metrics = self.state.metrics
        try:
            methods = self.routes.get(request.path)
            if methods is None:
                raise NotFound(f"no such endpoint: {request.path}")
            route = methods.get("GET" if request.method == "HEAD" else request.method)
            if route is None:
                raise MethodNotAllowed(
                    f"{request.method} is not allowed on {request.path} (allowed: {', '.join(methods)})",
                    allow=list(methods),
                )
            await route(request)
        except ProxyError as e:
            metrics.errors.labels(e.kind).inc()
            if e.status >= 500:
                log.warning("%s %s -> %d: %s", request.method, request.path, e.status, e.message)
            await _answer_error(request, e)
        except TimeoutError:
            metrics.errors.labels("timeout").inc()
            await _answer_error(
                request, UpstreamTimeout("the request did not finish within the total timeout (--total-timeout)")
            )
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception:  # the last line of defence: log it, fail this request, keep serving
            log.exception("internal error on %s %s", request.method, request.path)
            metrics.errors.labels("internal").inc()
            await _answer_error(request, ProxyError("internal proxy error"))

    def _generate(self, endpoint: Endpoint) -> Route:
        state, flow = self.state, self.flow

        async def generate(request: Request) -> None:
            check_content_type(request.headers.get("content-type"))
            req = parse_request(endpoint, request.body)
            admission = state.admission
            try:
                if not admission.try_enter():  # (admission.slot() without its coroutines where a slot is free)
                    await admission.wait()
                try:
                    await flow.serve(request, req)
                finally:
                    admission.exit()
            except asyncio.CancelledError:
                state.metrics.errors.labels("client_disconnect").inc()
                raise

        return generate

    async def models(self, request: Request) -> None:
        decoders = self.state.pool.admitted("decode")
        if not decoders:
            raise NoHealthyWorker("no healthy decode worker is admitted")
        payload = await self.state.upstream.get_json(
            decoders[0].url, "/v1/models", stage="models", timeout=self.config.timeouts.decode_first_byte_s
        )
        await request.respond(200, _encoder.encode(payload))

    async def health(self, request: Request) -> None:
        state = self.state
        counts = {role: len(state.pool.admitted(role)) for role in ("prefill", "decode")}
        now = time.monotonic()
        tokenizer_loading, warming = now < state.tokenizer_loading_until, now < state.pairs_warming_until
        ok = counts["decode"] > 0 and not self.draining and not tokenizer_loading and not warming
        if self.draining:
            status = "draining"
        elif counts["decode"] == 0:
            status = "no healthy decode worker"
        elif tokenizer_loading:
            status = "loading the tokenizer"
        else:
            status = "warming the PD pairs" if warming else "ok"
        body = {
            "status": status,
            "admitted": counts,
            "ejected": [w.url for w in state.pool.all() if not w.healthy],
            "terminating": [w.url for w in state.pool.all() if w.terminating],
            "kv_hashes_verified": state.kv_index.hashes_verified,
        }
        await request.respond(200 if ok else 503, _encoder.encode(body))

    async def livez(self, request: Request) -> None:
        await request.respond(200, b'{"status":"alive"}')

    async def metrics(self, request: Request) -> None:
        await request.respond(200, self.state.metrics.render(), content_type="text/plain; version=0.0.4")


async def _answer_error(request: Request, e: ProxyError) -> None:
    if request.started:  # mid-stream (the relay writes its own error event): the client cannot be told more
        return  # (an answer left unfinished: the server closes the connection)
    await request.respond(e.status, error_bytes(e), headers=e.headers)


@dataclass(frozen=True)
class RunningProxy:
    url: str
    app: ProxyApp
    server: HTTPServer

    @property
    def state(self) -> ProxyState:
        return self.app.state

    async def drain(self) -> bool:
        """The graceful stop (config.drain): readiness off at once; requests still served for delay_s while
        the endpoints' removal propagates (their answers say Connection: close); then the listener closes and
        open requests get timeout_s. True when all finished; leaving serve_in_background cuts the rest."""
        cfg = self.app.config.drain
        self.app.draining = self.server.draining = True
        log.info("draining: /health answers 503; serving new requests for %g s more", cfg.delay_s)
        await asyncio.sleep(cfg.delay_s)
        self.server.stop_accepting()
        open_now = self.server.open_requests
        log.info("draining: not accepting; waiting up to %g s for %d open requests", cfg.timeout_s, open_now)
        finished = await self.server.wait_idle(cfg.timeout_s)
        if not finished:
            log.warning("draining: requests still open after --drain-timeout-s %g s are cut", cfg.timeout_s)
        return finished


def serve_in_background(config: ProxyConfig) -> _Serving:
    """Run the proxy in this event loop on config.host:config.port (0 = a free port); stops it on exit
    (requests still open get 1 s, none once drain() began). Handlers are cancelled when their client disconnects
    (that is what aborts the decode leg)."""
    return _Serving(config)


class _Serving:
    """serve_in_background's context manager, written out: mypyc (the compiled build) has no async generators,
    so no @asynccontextmanager here."""

    def __init__(self, config: ProxyConfig):
        self.app = ProxyApp(config)
        self.background = Background(self.app.state)
        self.server: HTTPServer | None = None

    async def __aenter__(self) -> RunningProxy:
        config, state = self.app.config, self.app.state
        await state.upstream.start()
        await self.background.start()
        try:
            self.server = await HTTPServer.start(config.host, config.port, self.app.handle, Limits())
        except BaseException:
            await self._stop()
            raise
        return RunningProxy(f"http://{config.host}:{self.server.port}", self.app, self.server)

    async def __aexit__(self, *exc_info: object) -> None:
        await self._stop()

    async def _stop(self) -> None:
        if self.server is not None:
            await self.server.stop(grace_s=0.0 if self.server.draining else 1.0)
        await self.background.stop()
        await self.app.state.upstream.close()
        self.app.flow.early.close()
