"""The transport as one request's uvicorn cycle sees it (server.py puts one in each cycle): an answer's head
held for its first body bytes, a stream's middle parts written from a callback, a whole answer written at once."""

from __future__ import annotations

import asyncio
import functools

from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HEADER_VALUE_RE, STATUS_LINE, RequestResponseCycle


class HeadWithBody:
    """The transport as one request's cycle sees it: uvicorn writes an answer's head alone and then its body,
    two system calls per answer; the head is held here until the first body bytes (or the end of the answer, or
    a close) and leaves with them in one write. A `100 Continue` goes out at once (the client waits for it).

    It also writes the middle parts of a chunked answer without the cycle (write_now): a relay at a decoder's
    pace hands each event over from the decoder connection's callback, where awaiting the cycle's `send` is not
    possible. The head and the last part still go through `send` (uvicorn's state of the answer: started,
    chunked, complete); a middle part changes none of it, and is framed as `send` frames one.

    And it writes a whole answer with a body of known length at once (respond_now), in the bytes `send` would
    write and with the cycle's state left as `send` leaves it, without the two `send` calls (coroutines, ASGI
    messages, two regular expressions per header field): the answer of every request that is not streamed."""

    __slots__ = ("transport", "flow", "cycle", "_head", "_held_once")
    CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"

    def __init__(self, transport: asyncio.Transport, flow: FlowControl, cycle: RequestResponseCycle):
        self.transport, self.flow = transport, flow
        self.cycle: RequestResponseCycle | None = cycle  # until the request's handler returns (server.py's _asgi)
        self._head: bytes | None = None
        self._held_once = False

    def respond_now(self, status: int, content_type: str, body: bytes, close: bool) -> bool:
        """The whole answer in one write, as the cycle's `send` writes it (its default headers, content-type,
        content-length, `connection: close` where the connection ends), the cycle then complete. False where
        `send` must write it: the answer began, the client is gone or lags, the request is a HEAD, an access log."""
        cycle = self.cycle
        if (
            cycle is None  # (the request's handler has returned)
            or self._held_once
            or cycle.response_started
            or cycle.disconnected
            or self.flow.write_paused
            or cycle.access_log
            or cycle.scope["method"] == "HEAD"
        ):
            return False
        cycle.response_started = True
        cycle.waiting_for_100_continue = False
        parts = [STATUS_LINE[status], _default_fields(cycle.default_headers), _content_type_field(content_type)]
        parts.append(b"content-length: %d\r\n" % len(body))
        if close:
            cycle.keep_alive = False
        if not cycle.keep_alive:
            parts.append(b"connection: close\r\n")
        parts.append(b"\r\n")
        parts.append(body)
        cycle.chunked_encoding = False
        self._held_once = True
        self.transport.write(b"".join(parts))
        cycle.response_complete = True  # (what send does once the last body bytes are written)
        cycle.message_event.set()
        if not cycle.keep_alive:
            self.close()
        cycle.on_response()
        return True

    def can_write_now(self) -> bool:
        """write_now may write: the head left (it waits here for the first body bytes, which may come after
        Request.writer gave this out), the client keeps up (`send` would not wait) and is still there."""
        return self._head is None and not self.flow.write_paused and not self.transport.is_closing()

    def write_now(self, data: bytes) -> None:
        """One middle chunk of a chunked answer (only where can_write_now())."""
        self.transport.write(b"%x\r\n%b\r\n" % (len(data), data))

    def write(self, data: bytes) -> None:
        if not self._held_once and data != self.CONTINUE:
            self._held_once = True  # uvicorn's first write of an answer is its head
            self._head = data
            return
        if self._head is not None:
            data, self._head = self._head + data, None
        if data:
            self.transport.write(data)

    def flush(self) -> None:
        if self._head is not None:
            head, self._head = self._head, None
            self.transport.write(head)

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def is_closing(self) -> bool:
        return self.transport.is_closing()


_defaults: tuple[object, bytes] = (None, b"")  # server_state.default_headers (a list, replaced every second), written


def _default_fields(headers: list[tuple[bytes, bytes]]) -> bytes:
    global _defaults
    if _defaults[0] is not headers:
        _defaults = (headers, b"".join(b"%s: %s\r\n" % (name.lower(), value) for name, value in headers))
    return _defaults[1]


@functools.cache
def _content_type_field(content_type: str) -> bytes:
    value = content_type.encode("latin-1")
    if HEADER_VALUE_RE.search(value):  # (send's check; the proxy's content types are its own constants)
        raise RuntimeError("Invalid HTTP header value.")
    return b"content-type: %s\r\n" % value
