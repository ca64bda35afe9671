"""HTTP to the workers: one pooled keep-alive aiohttp session, and the one boundary where aiohttp and asyncio
errors become the proxy's UpstreamError tree (errors.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import msgspec

from .config import Timeouts
from .errors import UpstreamError, UpstreamStatus, UpstreamTimeout, UpstreamUnavailable

_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()
JSON_HEADERS = {"Content-Type": "application/json"}


class Upstream:
    def __init__(self, timeouts: Timeouts):
        self.timeouts = timeouts
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60, enable_cleanup_closed=True)
        # No cookie jar: a cookie one worker sets must not reach other clients' requests, and skipping the
        # jar saves its per-request filtering and update.
        self._session = aiohttp.ClientSession(
            connector=connector, auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar(),
            timeout=aiohttp.ClientTimeout(total=None, connect=self.timeouts.connect_s))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "Upstream.start() was not awaited"
        return self._session

    async def post_json(self, base: str, path: str, body: Any, *, timeout: float, stage: str,
                        headers: dict[str, str] | None = None) -> Any:
        """POST a JSON body, return the decoded JSON answer; HTTP >= 400 raises UpstreamStatus."""
        async with self._mapped(base, stage, timeout):
            async with self.session.post(base + path, data=_encoder.encode(body),
                                         headers={**JSON_HEADERS, **(headers or {})}) as resp:
                raw = await resp.read()
                return self._decode(resp.status, raw, base, stage)

    async def get_json(self, base: str, path: str, *, timeout: float, stage: str,
                       headers: dict[str, str] | None = None) -> Any:
        async with self._mapped(base, stage, timeout):
            async with self.session.get(base + path, headers=headers) as resp:
                return self._decode(resp.status, await resp.read(), base, stage)

    async def is_healthy(self, base: str) -> bool:
        try:
            async with asyncio.timeout(self.timeouts.health_s):
                async with self.session.get(base + "/health") as resp:
                    await resp.read()
                    return resp.status == 200
        except (aiohttp.ClientError, OSError, TimeoutError):
            return False

    @contextlib.asynccontextmanager
    async def open_post(self, base: str, path: str, body: Any, *, first_byte_timeout: float, stage: str,
                        headers: dict[str, str] | None = None) -> AsyncIterator[aiohttp.ClientResponse]:
        """POST and yield the open response once its headers arrived (HTTP >= 400 raises UpstreamStatus).
        Leaving the block closes the connection: for a response not read to its end, that aborts the request
        on the worker (vLLM aborts a request whose client went away)."""
        async with self._mapped(base, stage, first_byte_timeout):
            resp = await self.session.post(base + path, data=_encoder.encode(body),
                                           headers={**JSON_HEADERS, **(headers or {})})
            try:
                if resp.status >= 400:
                    raw = await resp.read()
                    self._decode(resp.status, raw, base, stage)
            except BaseException:
                resp.close()
                raise
        try:
            yield resp
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as e:
            raise UpstreamUnavailable(f"{stage} worker {base} broke the response: {e!r}", worker=base,
                                      stage=stage) from None
        finally:
            resp.close()  # not release(): an unfinished stream must not go back to the pool

    @contextlib.asynccontextmanager
    async def _mapped(self, base: str, stage: str, timeout: float) -> AsyncIterator[None]:
        try:
            async with asyncio.timeout(timeout):
                yield
        except UpstreamError:
            raise
        except TimeoutError:
            raise UpstreamTimeout(f"{stage} worker {base} gave no answer within {timeout:g} s", worker=base,
                                  stage=stage) from None
        except (aiohttp.ClientError, OSError) as e:
            raise UpstreamUnavailable(f"{stage} worker {base} unreachable: {e!r}", worker=base,
                                      stage=stage) from None

    @staticmethod
    def _decode(status: int, raw: bytes, base: str, stage: str) -> Any:
        try:
            payload = _decoder.decode(raw) if raw else None
        except msgspec.DecodeError:
            payload = raw.decode("utf-8", "replace")[:500]
            if status < 400:
                raise UpstreamUnavailable(f"{stage} worker {base} answered HTTP {status} with a body that is "
                                          "not JSON", worker=base, stage=stage) from None
        if status >= 400:
            raise UpstreamStatus(status, payload, worker=base, stage=stage)
        return payload
