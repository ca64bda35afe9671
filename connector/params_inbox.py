"""D's params inbox (early decode): where the proxy delivers the outcome of P's call for a request D admitted early.

One ZMQ PULL socket, bound by the decoder's scheduler-side connector (the engine-core process, where the waits
live: awaiting.py) on `tcp://host:port`, host being the address peers reach this engine at (the side channel's).
The proxy connects a PUSH socket per decoder and sends msgpack `PrefillOutcome`s. Nothing here runs a thread:
the scheduler drains the socket in its own steps, and in a step with nothing to compute waits on it a short while
(so a delivered outcome is seen at once, not at the next step). ZMQ errors are mapped to TransportError here,
the only place the scheduler side touches ZMQ.
"""

from __future__ import annotations

import logging

import zmq

from hybrid_pd.connector.errors import ConnectorError, TransportError
from hybrid_pd.connector.messages import PrefillOutcome, decode_outcome

log = logging.getLogger("vllm." + __name__)  # under vLLM's configured logger


class ParamsInbox:
    def __init__(self, host: str, port: int):
        self.address = f"tcp://{host}:{port}"
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.PULL)
        self._sock.setsockopt(zmq.LINGER, 0)
        try:
            self._sock.bind(self.address)
        except zmq.ZMQError as e:
            self._ctx.destroy(linger=0)
            raise TransportError(
                f"cannot bind the params inbox on {self.address}: {e} (is HYBRID_PD_PARAMS_PORT free?)"
            ) from e

    def drain(self, wait_s: float = 0.0) -> list[PrefillOutcome]:
        """Every outcome delivered so far, waiting up to `wait_s` for the first when none is there yet."""
        out: list[PrefillOutcome] = []
        try:
            if wait_s > 0 and not self._sock.poll(int(wait_s * 1000)):
                return out
            while True:
                try:
                    raw = self._sock.recv(zmq.NOBLOCK)
                except zmq.Again:
                    return out
                try:
                    out.append(decode_outcome(raw))
                except ConnectorError as e:
                    log.warning("params inbox %s: ignoring a message: %s", self.address, e)
        except zmq.ZMQError as e:
            raise TransportError(f"params inbox {self.address}: {e}") from e

    def close(self) -> None:
        self._sock.close(0)
        self._ctx.term()


def connect_push(ctx: zmq.Context[zmq.Socket[bytes]], address: str) -> zmq.Socket[bytes]:
    """A PUSH socket connecting to the inbox at `address` (the proxy's outbox and a prefiller's own delivery): its
    messages go only onto a live connection (ZMQ_IMMEDIATE: a send without one fails at once, nothing queued for an
    inbox that may never come) and are dropped at close (LINGER 0). ZMQError where it cannot connect."""
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IMMEDIATE, 1)
    try:
        sock.connect(address)
    except zmq.ZMQError:
        sock.close(0)
        raise
    return sock
