"""Copy the decoder's answer to the client: whole JSON, or Server-Sent Events as they come.

Both fix `cached_tokens` (usage.py) and drop the decoder's `kv_transfer_params` (internal to PD). A stream
is copied from D's connection callback straight to the client's transport, whatever arrived in one read as one
chunk (not line by line, and without waking the request's task per read: each of those cost the proxy more
CPU per request than everything else it does); only an SSE line that carries usage details or
kv_transfer_params is decoded and re-encoded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from .errors import HTTPClientError, ProxyError, ShuttingDown, UpstreamTimeout, UpstreamUnavailable
from .http_request import Request
from .upstream import unavailable
from .upstream_response import Response

_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


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
    request.respond(resp.status, _encoder.encode(payload))
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
        first = await resp.readany(first_byte_timeout)
    except TimeoutError:
        raise UpstreamTimeout(
            f"decode worker {worker} sent no first byte within {first_byte_timeout:g} s", worker=worker, stage="decode"
        ) from None
    result = SSEResult(resp.status)
    pipe = _SSEPipe(request, resp, fix, result)
    try:
        request.begin_stream(resp.status, "text/event-stream", SSE_HEADERS)  # the head leaves with the first data
        if first:
            on_first_byte()
        if not resp.complete:
            request.write(pipe.complete_lines(first))
            await pipe.run(loop, deadline)
            first = await resp.readany()  # the piece that came with the end of D's body (stream_to keeps it)
        # The last lines (and the tail of a line, when the stream ended inside one) leave with the end of the
        # answer, in one write; a lagging client gets until the deadline to take it.
        last = pipe.complete_lines(first)
        if pipe.partial:
            last += _fix_lines(pipe.partial, fix, result)
        _check_client(request)
        request.end_stream(last)
        if request.writing_paused:
            async with asyncio.timeout_at(deadline):
                await request.drain()
    except TimeoutError:
        result.broken = UpstreamTimeout(
            f"decode worker {worker} did not finish before the total timeout", worker=worker, stage="decode"
        )
        write_stream_error(request, result.broken)
    except ConnectionResetError:
        result.client_gone = True  # leaving returns D's connection closed: vLLM aborts the request
    except asyncio.CancelledError:
        # the proxy stops and its drain timeout passed (a client that left has no transport: nothing is written)
        write_stream_error(
            request,
            ShuttingDown(
                "the proxy is shutting down and its drain timeout (--drain-timeout-s) passed; retry the request"
            ),
        )
        raise
    except HTTPClientError as e:
        result.broken = unavailable(e, worker, "decode", "broke the stream")
        write_stream_error(request, result.broken)
    finally:
        resp.stop_streaming()
    return result


class _SSEPipe:
    """Copies D's body to the client's transport from D's connection callback (http1.Response.stream_to):
    per arriving piece, the complete lines are written as one chunk, the tail of a line waits for its end (so a
    line to rewrite is always seen whole). The relaying task sleeps in run() until the body ends, breaks, the
    client leaves, or the client lags: then reading from D pauses until the client's buffer drained."""

    def __init__(self, request: Request, resp: Response, fix: FixUsage, result: SSEResult):
        self.request, self.resp, self.fix, self.result = request, resp, fix, result
        self.partial = b""
        self._ended = False
        self._error: BaseException | None = None
        self._lagging = False
        self._wake: asyncio.Future | None = None

    def complete_lines(self, data: bytes) -> bytes:
        """The complete lines of what arrived (rewritten where needed); keeps the tail of a line for later."""
        if self.partial:
            data, self.partial = self.partial + data, b""
        end = data.rfind(b"\n") + 1
        if end < len(data):
            data, self.partial = data[:end], data[end:]
        if data and (b'"prompt_tokens_details"' in data or b'"kv_transfer_params"' in data):
            data = _fix_lines(data, self.fix, self.result)
        return data

    async def run(self, loop: asyncio.AbstractEventLoop, deadline: float) -> None:
        """Relay until D's body ends; raises what broke it: D's error, ConnectionResetError (the client left),
        TimeoutError (the deadline, a loop time, passed)."""
        timer = loop.call_at(deadline, self._stop, TimeoutError())
        self.resp.stream_to(self._on_data, self._on_end)
        try:
            while True:
                if self._ended:  # first: a deadline or a client gone after the last byte changes nothing
                    return
                if self._error is not None:
                    raise self._error
                drain = None
                if self._lagging:  # wait for the client's buffer to drain, or for the deadline
                    drain = loop.create_task(self.request.drain())
                    drain.add_done_callback(lambda _: self._notify())
                self._wake = loop.create_future()
                try:
                    await self._wake
                finally:
                    self._wake = None
                    if drain is not None and not drain.done():
                        drain.cancel()
                if drain is not None and drain.done() and not drain.cancelled():
                    drain.result()  # raises when the client's connection was lost meanwhile
                    self._lagging = False
                    self.resp.resume_reading()
        finally:
            timer.cancel()

    def _on_data(self, data: bytes) -> None:
        data = self.complete_lines(data)
        if not data:
            return
        request = self.request
        transport = request.conn.transport
        if transport is None or transport.is_closing():
            self._stop(ConnectionResetError("the client closed its connection"))
            return
        transport.write(request.frame(data))
        if request.conn.writing_paused:  # the client's buffer is past its high-water mark
            self._lagging = True
            self.resp.pause_reading()
            self._notify()

    def _on_end(self, exc: BaseException | None) -> None:
        if exc is None:
            self._ended = True
            self._notify()
        else:
            self._stop(exc)

    def _stop(self, exc: BaseException) -> None:
        self.resp.stop_streaming()
        self._error = exc
        self._notify()

    def _notify(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)


@dataclass
class SSEResult:
    status: int
    usage: dict[str, Any] | None = None
    broken: ProxyError | None = None  # the stream ended early because the decoder failed
    client_gone: bool = False  # the client closed its connection mid-stream


def write_stream_error(request: Request, err: ProxyError) -> None:
    """An error after the stream began: the status is sent already, so tell the client in an SSE event and end
    the answer. A client that does not read (its buffer is full) gets its connection closed instead."""
    transport = request.transport
    if transport is None or transport.is_closing():
        return
    if request.writing_paused:
        transport.abort()
        return
    request.end_stream(b"data: " + _encoder.encode(err.body()) + b"\n\n")


def _check_client(request: Request) -> None:
    transport = request.transport
    if transport is None or transport.is_closing():
        raise ConnectionResetError("the client closed its connection")


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
