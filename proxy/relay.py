"""Copy the decoder's answer to the client: whole JSON, or Server-Sent Events as they come.

Both fix `cached_tokens` (usage.py) and drop the decoder's `kv_transfer_params` (internal to PD). A stream is
copied as it arrives, whatever came in one read as one chunk (not line by line); only an SSE line that carries
usage details or kv_transfer_params is decoded and re-encoded. After its first part, a stream is copied from D's
connection callback to the client's connection (http/response.py's pipe, http/request.py's write_now), without
waking the request's task per read: at a decoder's pace every event is a read of its own. A client that lags
holds the copy: the callback leaves the piece to the task, whose write waits for the client, and D's connection
stops being read once its unread bytes pass a limit (http/response.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from .errors import HTTPClientError, ProxyError, ShuttingDown, UpstreamTimeout, UpstreamUnavailable
from .http.request import Connection, Request
from .http.response import Response

_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
LAST_WORDS_S = 1.0  # how long an error event may wait for a lagging client before the connection is closed


FixUsage = Callable[[dict[str, Any]], int | None]


async def relay_json(
    request: Request, resp: Response, fix: FixUsage, *, worker: str, deadline: float, loop: asyncio.AbstractEventLoop
) -> Any:
    """Answer D's whole JSON (fixed) to the client; returns the decoded payload."""
    try:
        raw = await resp.read(max(0.0, deadline - loop.time()))
    except TimeoutError:
        raise UpstreamTimeout(
            f"decode worker {worker} did not finish before the total timeout", worker=worker, stage="decode"
        ) from None
    try:
        payload = _decoder.decode(raw)
    except msgspec.DecodeError:
        raise UpstreamUnavailable(
            f"decode worker {worker} answered a body that is not JSON", worker=worker, stage="decode"
        ) from None
    if isinstance(payload, dict):
        payload.pop("kv_transfer_params", None)
        fix(payload)
    await request.respond(resp.status, _encoder.encode(payload))
    return payload


async def relay_sse(
    request: Request,
    resp: Response,
    fix: FixUsage,
    *,
    worker: str,
    first_byte_timeout: float,
    deadline: float,
    loop: asyncio.AbstractEventLoop,
    on_first_byte: Callable[[], None],
) -> SSEResult:
    """Stream D's SSE to the client. The first bytes must come within `first_byte_timeout` seconds, or
    UpstreamTimeout is raised before anything was sent. A stream that breaks later ends with an SSE error
    event (the status line is gone already), and so does one cancelled because the proxy stops; a client that
    goes away sets client_gone."""
    try:
        data = await resp.readany(first_byte_timeout)
    except TimeoutError:
        raise UpstreamTimeout(
            f"decode worker {worker} sent no first byte within {first_byte_timeout:g} s", worker=worker, stage="decode"
        ) from None
    result = SSEResult(resp.status)
    lines = _Lines(fix, result)
    try:
        request.begin_stream(resp.status, "text/event-stream", SSE_HEADERS)  # the head leaves with the first data
        if data:
            on_first_byte()
        async with asyncio.timeout_at(deadline):
            # The last lines (and the tail of a line, when the stream ended inside one) leave with the end of
            # the answer: one write instead of two.
            while not resp.complete:
                await request.write(lines.complete(data))  # the first part, or one the client could not take
                lines.conn = request.writer()
                if lines.conn is not None:  # until the end, or a piece the client cannot take at once
                    await resp.pipe(lines.write_now)
                    if lines.error is not None:
                        raise lines.error
                data = await resp.readany()
            last = lines.complete(data) + lines.rest()
            await request.end_stream(last)
    except TimeoutError:
        result.broken = UpstreamTimeout(
            f"decode worker {worker} did not finish before the total timeout", worker=worker, stage="decode"
        )
        await write_stream_error(request, result.broken)
    except asyncio.CancelledError:
        if request.client_gone:  # leaving returns D's connection closed: vLLM aborts the request
            result.client_gone = True
            task = asyncio.current_task()
            assert task is not None
            task.uncancel()
            return result
        # the proxy stops and its drain timeout passed
        await write_stream_error(
            request,
            ShuttingDown(
                "the proxy is shutting down and its drain timeout (--drain-timeout-s) passed; retry the request"
            ),
        )
        raise
    except HTTPClientError as e:
        result.broken = UpstreamUnavailable.of(e, worker, "decode", "broke the stream")
        await write_stream_error(request, result.broken)
    return result


class _Lines:
    """Cuts what arrives into complete lines (rewritten where needed); keeps the tail of a line for later, so
    that a line to rewrite is always seen whole."""

    def __init__(self, fix: FixUsage, result: SSEResult):
        self.fix, self.result = fix, result
        self.partial = b""
        self.conn: Connection | None = None  # the client's, while write_now may write to it (Request.writer)
        self.error: Exception | None = None  # what write_now met, raised in the relaying task

    def write_now(self, data: bytes) -> bool:
        """Response.pipe's sink, in D's connection callback: the complete lines of `data` to the client at once;
        False (`data` left unread) where the client cannot take them now."""
        conn = self.conn
        if conn is None or not conn.can_write_now():
            return False
        try:
            out = self.complete(data)
        except Exception as e:  # (a callback's exception would be the event loop's): the task raises it
            self.error = e
            return False
        if out:
            conn.write_now(out)
        return True

    def complete(self, data: bytes) -> bytes:
        if self.partial:
            data, self.partial = self.partial + data, b""
        end = data.rfind(b"\n") + 1
        if end < len(data):
            data, self.partial = data[:end], data[end:]
        if data and (b'"prompt_tokens_details"' in data or b'"kv_transfer_params"' in data):
            data = _fix_lines(data, self.fix, self.result)
        return data

    def rest(self) -> bytes:
        """The tail of a line the stream ended inside."""
        rest, self.partial = self.partial, b""
        return _fix_lines(rest, self.fix, self.result) if rest else b""


@dataclass
class SSEResult:
    status: int
    usage: dict[str, Any] | None = None
    broken: ProxyError | None = None  # the stream ended early because the decoder failed
    client_gone: bool = False  # the client closed its connection mid-stream


async def write_stream_error(request: Request, err: ProxyError) -> None:
    """An error after the stream began: the status is sent already, so tell the client in an SSE event and end
    the answer. A client that does not take it within LAST_WORDS_S has its connection closed instead."""
    if request.client_gone:
        return
    try:
        async with asyncio.timeout(LAST_WORDS_S):
            await request.end_stream(b"data: " + _encoder.encode(err.body()) + b"\n\n")
    except TimeoutError:
        pass  # the answer stays unfinished: the server closes the connection


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
    body = line[len(b"data: ") :].rstrip(b"\r\n")
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
