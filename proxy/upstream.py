"""HTTP to the workers: pooled keep-alive connections (http/client.py), and the one boundary where the HTTP client's
errors and asyncio's timeouts become the proxy's UpstreamError tree (errors.py; UpstreamUnavailable.of, which the
relay uses too for an answer that breaks mid-stream).

The calls to the workers go through http.client.HTTPPool; the aiohttp session stays for what is not on a request's
path (the Kubernetes API, with TLS and its own headers)."""

from __future__ import annotations

import time
from typing import Any, NoReturn

import aiohttp
import msgspec

from .config.sections import Timeouts
from .errors import HTTPClientError, UpstreamError, UpstreamStatus, UpstreamTimeout, UpstreamUnavailable
from .http.client import HTTPPool
from .http.response import Leave, Response

# post_json's `leave_behind` option: LeaveBehind(until, on_end) (a loop time; run when the connection is done with
# the answer), `.taken` once the caller stopped waiting and the answer was left behind
LeaveBehind = Leave

_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()
JSON_HEADERS = {"Content-Type": "application/json"}


class Upstream:
    def __init__(self, timeouts: Timeouts):
        self.timeouts = timeouts
        self._session: aiohttp.ClientSession | None = None
        self.pool = HTTPPool(connect_timeout=timeouts.connect_s)

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60, enable_cleanup_closed=True)
        # No cookie jar: a cookie one worker sets must not reach other clients' requests.
        self._session = aiohttp.ClientSession(
            connector=connector,
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),
            timeout=aiohttp.ClientTimeout(total=None, connect=self.timeouts.connect_s),
        )

    async def close(self) -> None:
        self.pool.close()
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "Upstream.start() was not awaited"
        return self._session

    async def post_json(
        self,
        base: str,
        path: str,
        body: Any,
        *,
        timeout: float,
        stage: str,
        headers: dict[str, str] | None = None,
        leave_behind: LeaveBehind | None = None,
    ) -> Any:
        """POST a JSON body, return the decoded JSON answer; HTTP >= 400 raises UpstreamStatus. With
        `leave_behind`, a caller cancelled or timed out leaves the answer behind (the connection reads it unseen,
        until leave_behind.until) rather than dropping the connection, which the worker takes as its client
        leaving."""
        return await self._call(
            "POST", base, path, _encoder.encode(body), _json_headers(headers), timeout, stage, leave_behind
        )

    async def get_json(
        self, base: str, path: str, *, timeout: float, stage: str, headers: dict[str, str] | None = None
    ) -> Any:
        return await self._call("GET", base, path, None, headers, timeout, stage)

    async def is_healthy(self, base: str) -> bool:
        try:
            resp = await self.pool.request("GET", base, "/health", None, None, timeout=self.timeouts.health_s)
            try:
                await resp.read(self.timeouts.health_s)
            finally:
                resp.close()
            return resp.status == 200
        except (HTTPClientError, OSError, TimeoutError):
            return False

    async def get_text(self, base: str, path: str) -> str | None:
        """GET base+path: the body when it answers 200, else None (a worker's /metrics: a miss is no error)."""
        try:
            resp = await self.pool.request("GET", base, path, None, None, timeout=self.timeouts.health_s)
            try:
                raw = await resp.read(self.timeouts.health_s)
            finally:
                resp.close()
        except (HTTPClientError, OSError, TimeoutError):
            return None
        return raw.decode("utf-8", "replace") if resp.status == 200 else None

    def open_post(
        self,
        base: str,
        path: str,
        body: Any,
        *,
        first_byte_timeout: float,
        stage: str,
        headers: dict[str, str] | None = None,
    ) -> OpenPost:
        """POST and yield the open response once its headers arrived (HTTP >= 400 raises UpstreamStatus).
        Leaving the block closes the connection: for a response not read to its end, that aborts the request
        on the worker (vLLM aborts a request whose client went away)."""
        return OpenPost(self, base, path, _encoder.encode(body), _json_headers(headers), first_byte_timeout, stage)

    async def _call(
        self,
        method: str,
        base: str,
        path: str,
        body: bytes | None,
        headers: dict[str, str] | None,
        timeout: float,
        stage: str,
        leave: Leave | None = None,
    ) -> Any:
        start = time.monotonic()
        try:
            resp = await self.pool.request(method, base, path, body, headers, timeout=timeout, leave=leave)
            try:
                raw = await resp.read(max(0.0, start + timeout - time.monotonic()))
            except BaseException:
                if leave is not None:
                    resp.leave(leave)
                raise
            finally:
                if leave is None or not leave.taken:
                    resp.close()
        except (TimeoutError, HTTPClientError, OSError) as e:
            _raise_mapped(e, base, stage, timeout)
        return self._decode(resp.status, raw, base, stage)

    @staticmethod
    def _decode(status: int, raw: bytes, base: str, stage: str) -> Any:
        try:
            payload = _decoder.decode(raw) if raw else None
        except msgspec.DecodeError:
            payload = raw.decode("utf-8", "replace")[:500]
            if status < 400:
                raise UpstreamUnavailable(
                    f"{stage} worker {base} answered HTTP {status} with a body that is not JSON",
                    worker=base,
                    stage=stage,
                ) from None
        if status >= 400:
            raise UpstreamStatus(status, payload, worker=base, stage=stage)
        return payload


class OpenPost:
    """Upstream.open_post's context (a class: the request path enters one per decode, and a generator-based
    context manager costs several frames and a generator more)."""

    __slots__ = ("upstream", "base", "path", "data", "headers", "timeout", "stage", "resp")

    def __init__(
        self, upstream: Upstream, base: str, path: str, data: bytes, headers: dict[str, str], timeout: float, stage: str
    ):
        self.upstream, self.base, self.path, self.data, self.headers = upstream, base, path, data, headers
        self.timeout, self.stage = timeout, stage
        self.resp: Response | None = None

    async def __aenter__(self) -> Response:
        base, stage, timeout = self.base, self.stage, self.timeout
        try:
            resp = await self.upstream.pool.request("POST", base, self.path, self.data, self.headers, timeout=timeout)
            if resp.status >= 400:
                try:
                    self.upstream._decode(resp.status, await resp.read(timeout), base, stage)
                finally:
                    resp.close()
        except UpstreamError:
            raise
        except (TimeoutError, HTTPClientError, OSError) as e:
            _raise_mapped(e, base, stage, timeout)
        self.resp = resp
        return resp

    async def __aexit__(self, kind: type[BaseException] | None, e: BaseException | None, tb: Any) -> None:
        assert self.resp is not None
        self.resp.close()  # an unfinished answer's connection is dropped, not pooled
        if isinstance(e, HTTPClientError):
            raise UpstreamUnavailable.of(e, self.base, self.stage, "broke the response") from None


def _json_headers(headers: dict[str, str] | None) -> dict[str, str]:
    return {**JSON_HEADERS, **headers} if headers else JSON_HEADERS


def _raise_mapped(e: BaseException, base: str, stage: str, timeout: float) -> NoReturn:
    if isinstance(e, TimeoutError):
        raise UpstreamTimeout(
            f"{stage} worker {base} gave no answer within {timeout:g} s", worker=base, stage=stage
        ) from None
    assert isinstance(e, (HTTPClientError, OSError))
    raise UpstreamUnavailable.of(e, base, stage) from None
