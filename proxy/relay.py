"""Copy the decoder's answer to the client: whole JSON, or Server-Sent Events line by line.

Both fix `cached_tokens` (usage.py) and drop the decoder's `kv_transfer_params` (internal to PD). A stream
is copied as it comes, whatever arrived in one write (not line by line: that doubled the proxy's CPU per
request); only an SSE line that carries usage details or kv_transfer_params is decoded and re-encoded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import msgspec
from aiohttp import web

from .errors import ProxyError, UpstreamTimeout, UpstreamUnavailable
from .http1 import Response

_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


FixUsage = Callable[[dict[str, Any]], int | None]


async def relay_json(resp: Response, fix: FixUsage, *, worker: str,
                     deadline: float) -> tuple[web.Response, Any]:
    try:
        raw = await resp.read(max(0.0, deadline - asyncio.get_running_loop().time()))
    except TimeoutError:
        raise UpstreamTimeout(f"decode worker {worker} did not finish before the total timeout", worker=worker,
                              stage="decode") from None
    try:
        payload = _decoder.decode(raw)
    except msgspec.DecodeError:
        raise UpstreamUnavailable(f"decode worker {worker} answered a body that is not JSON", worker=worker,
                                  stage="decode") from None
    if isinstance(payload, dict):
        payload.pop("kv_transfer_params", None)
        fix(payload)
    return web.Response(body=_encoder.encode(payload), status=resp.status, content_type="application/json"), payload


async def relay_sse(request: web.Request, resp: Response, fix: FixUsage, *, worker: str,
                    first_byte_timeout: float, deadline: float, on_first_byte: Callable[[], None]) -> SSEResult:
    """Stream D's SSE to the client. The first bytes must come within `first_byte_timeout` seconds, or
    UpstreamTimeout is raised before anything was sent. A stream that breaks later ends with an SSE error
    event (the status line is gone already); a client that goes away sets client_gone."""
    try:
        first = await resp.readany(first_byte_timeout)
    except TimeoutError:
        raise UpstreamTimeout(f"decode worker {worker} sent no first byte within {first_byte_timeout:g} s",
                              worker=worker, stage="decode") from None
    result = SSEResult(web.StreamResponse(status=resp.status, headers=SSE_HEADERS))
    out = result.response
    try:
        await out.prepare(request)
        if first:
            on_first_byte()
        async with asyncio.timeout_at(deadline):
            # Copy whatever has arrived in one write; only complete lines are written, the tail of a line
            # waits for its end, so that a line to rewrite is always seen whole.
            data, partial = first, b""
            while data:
                if partial:
                    data, partial = partial + data, b""
                end = data.rfind(b"\n") + 1
                if end < len(data):
                    data, partial = data[:end], data[end:]
                if data:
                    if b'"prompt_tokens_details"' in data or b'"kv_transfer_params"' in data:
                        data = _fix_lines(data, fix, result)
                    await out.write(data)
                data = await resp.readany()
            if partial:  # the stream ended inside a line: pass it on as it is
                await out.write(_fix_lines(partial, fix, result))
        await out.write_eof()
    except TimeoutError:
        result.broken = UpstreamTimeout(f"decode worker {worker} did not finish before the total timeout",
                                        worker=worker, stage="decode")
        await write_stream_error(out, result.broken)
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        result.client_gone = True  # leaving returns D's connection closed: vLLM aborts the request
    except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as e:
        result.broken = UpstreamUnavailable(f"decode worker {worker} broke the stream: {e!r}", worker=worker,
                                            stage="decode")
        await write_stream_error(out, result.broken)
    return result


@dataclass
class SSEResult:
    response: web.StreamResponse
    usage: dict[str, Any] | None = None
    broken: ProxyError | None = None  # the stream ended early because the decoder failed
    client_gone: bool = False  # the client closed its connection mid-stream


async def write_stream_error(out: web.StreamResponse, err: ProxyError) -> None:
    """An error after the stream began: the status is sent already, so tell the client in an SSE event."""
    try:
        await out.write(b"data: " + _encoder.encode(err.body()) + b"\n\n")
        await out.write_eof()
    except (ConnectionResetError, aiohttp.ClientConnectionResetError, RuntimeError):
        pass


def _fix_lines(data: bytes, fix: FixUsage, result: SSEResult) -> bytes:
    """Rewrite the `data: {` lines that carry usage details or kv_transfer_params; keep the others as they are."""
    out = []
    for line in data.splitlines(keepends=True):
        if line.startswith(b"data: {") and (b'"prompt_tokens_details"' in line or b'"kv_transfer_params"' in line):
            line, usage = _fix_line(line, fix)
            result.usage = usage or result.usage
        out.append(line)
    return b"".join(out)


def _fix_line(line: bytes, fix: FixUsage) -> tuple[bytes, dict[str, Any] | None]:
    body = line[len(b"data: "):].rstrip(b"\r\n")
    try:
        chunk = _decoder.decode(body)
    except msgspec.DecodeError:
        return line, None
    if not isinstance(chunk, dict):
        return line, None
    chunk.pop("kv_transfer_params", None)
    fix(chunk)
    usage = chunk.get("usage") if isinstance(chunk.get("usage"), dict) else None
    return b"data: " + _encoder.encode(chunk) + b"\n", usage
