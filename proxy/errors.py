"""Errors of the proxy, and the one place where they become OpenAI-shaped HTTP responses.

    ProxyError                       -> HTTP status, OpenAI error `type`; `kind` labels the errors metric
    +-- ConfigError                  a configuration that cannot work; the message names the flag to change
    +-- BadRequest                   400 invalid_request_error: malformed JSON, wrong types
    |   +-- NotFound                 404 no such endpoint
    |   +-- MethodNotAllowed         405 the endpoint does not take this method (the answer carries Allow)
    +-- Overloaded                   429 rate_limit_error: the bounded queue is full or waiting took too long
    +-- NoHealthyWorker              503 service_unavailable: no worker of the needed role is admitted
    +-- ShuttingDown                 503 service_unavailable: the proxy stops (a stream cut at its drain timeout)
    +-- UpstreamError                a worker did not give a usable answer (mapped from the HTTP client's
        |                            errors and asyncio's at the one boundary in upstream.py)
        +-- UpstreamStatus           the worker answered with an HTTP error; 4xx is passed through as is
        +-- UpstreamTimeout          504 a per-stage deadline passed (prefill, decode first byte, total)
        +-- UpstreamUnavailable      502 connection refused/reset, or a response that is not what vLLM sends

Prefill-stage UpstreamErrors other than 4xx never reach the client: the PD flow falls back to decode-only.

The proxy's HTTP client (http/client.py, http/response.py) raises its own small tree, which upstream.py maps to
UpstreamUnavailable (asyncio's TimeoutError, to UpstreamTimeout):

    HTTPClientError                  no whole answer from the worker
    +-- ConnectFailed                no connection could be opened
    +-- Disconnected                 the worker closed the connection before the answer's head (`retryable`: a
    |                                reused connection closed before it read the request; sent again once)
    +-- BrokenAnswer                 closed mid-body, or bytes that are not an HTTP/1.1 answer
"""

from __future__ import annotations

from typing import Any

import msgspec


class ProxyError(Exception):
    status: int = 500
    type: str = "internal_error"
    kind: str = "internal"  # the errors metric's label
    code: str | None = None
    headers: dict[str, str] | None = None  # of the error answer (405's Allow)

    def __init__(self, message: str, *, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param

    def body(self) -> dict[str, Any]:
        return openai_error(self.message, self.type, self.param, self.code or self.status)


class ConfigError(ProxyError):
    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("invalid proxy configuration:\n" + "\n".join(f"  - {p}" for p in self.problems))


class BadRequest(ProxyError):
    status = 400
    type = "invalid_request_error"
    kind = "bad_request"


class NotFound(BadRequest):
    status = 404


class MethodNotAllowed(BadRequest):
    status = 405

    def __init__(self, message: str, *, allow: list[str]):
        super().__init__(message)
        self.headers = {"Allow": ", ".join(allow)}


class Overloaded(ProxyError):
    status = 429
    type = "rate_limit_error"
    kind = "overloaded"
    code = "queue_full"


class NoHealthyWorker(ProxyError):
    status = 503
    type = "service_unavailable"
    kind = "no_healthy_worker"
    code = "no_healthy_worker"


class ShuttingDown(ProxyError):
    status = 503
    type = "service_unavailable"
    code = "shutting_down"


class UpstreamError(ProxyError):
    status = 502
    type = "upstream_error"
    kind = "upstream"

    def __init__(self, message: str, *, worker: str = "", stage: str = ""):
        super().__init__(message)
        self.worker = worker
        self.stage = stage


class UpstreamStatus(UpstreamError):
    """The worker answered `status`; `payload` is its decoded JSON body (or None)."""

    def __init__(self, status: int, payload: Any, *, worker: str = "", stage: str = ""):
        self.status = status
        self.payload = payload
        super().__init__(_message_of(payload) or f"worker answered HTTP {status}", worker=worker, stage=stage)
        self.type = "invalid_request_error" if 400 <= status < 500 else "upstream_error"
        self.kind = "upstream_4xx" if 400 <= status < 500 else "upstream_5xx"

    @property
    def is_client_error(self) -> bool:
        return 400 <= self.status < 500

    def body(self) -> dict[str, Any]:
        """vLLM already answers OpenAI-shaped errors; keep its body when it is one, else wrap it."""
        if isinstance(self.payload, dict) and isinstance(self.payload.get("error"), dict):
            err = self.payload["error"]
            return openai_error(
                str(err.get("message", self.message)),
                str(err.get("type") or self.type),
                err.get("param"),
                err.get("code", self.status),
            )
        return openai_error(self.message, self.type, None, self.status)


class UpstreamTimeout(UpstreamError):
    status = 504
    type = "timeout"
    kind = "timeout"
    code = "upstream_timeout"


class UpstreamUnavailable(UpstreamError):
    status = 502
    type = "upstream_error"
    kind = "unavailable"
    code = "upstream_unavailable"

    @classmethod
    def of(cls, e: BaseException, worker: str, stage: str, what: str = "unreachable") -> UpstreamUnavailable:
        """The HTTP client's error (or the socket's) as the proxy's: `{stage} worker {worker} {what}: {e!r}`."""
        return cls(f"{stage} worker {worker} {what}: {e!r}", worker=worker, stage=stage)


class HTTPClientError(Exception):
    """The proxy's HTTP client got no whole answer (mapped to UpstreamUnavailable in upstream.py)."""


class ConnectFailed(HTTPClientError):
    pass


class Disconnected(HTTPClientError):
    def __init__(self, message: str = "the worker closed the connection before answering", *, retryable: bool = False):
        super().__init__(message)
        self.retryable = retryable


class BrokenAnswer(HTTPClientError):
    pass


def openai_error(message: str, type_: str, param: str | None, code: Any) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_bytes(err: ProxyError) -> bytes:
    return msgspec.json.encode(err.body())


def _message_of(payload: Any) -> str | None:
    if isinstance(payload, dict):
        err = payload.get("error", payload)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(payload.get("detail"), str):  # FastAPI's default error shape
            return payload["detail"]
    if isinstance(payload, str) and payload:
        return payload[:500]
    return None
