"""The proxy's side of early decode (--early-decode): the outcome of P's call, delivered to the decoder that was sent
the request early, at that decoder's params inbox (connector/params_inbox.py, advertised as --decode-inbox).

One ZMQ PUSH socket per inbox address, kept. Its messages go only onto a live connection (ZMQ_IMMEDIATE): one
for an inbox that is not there is refused, not queued for a decoder that may never come, so that a delivery
that fails is known to have failed (the proxy then withdraws the early request: early_decode.py). A new socket gets
CONNECT_WAIT_S to connect; a kept one whose connection is down (its decoder restarted, or is gone) would
reconnect on ZMQ's own timer (every 100 ms): the delivery is tried once more on a fresh socket instead, which
connects at once to an inbox that is there. A send never blocks the event loop: a connection on its way is
awaited in short sleeps. ZMQ errors are mapped here, to False.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import zmq

from hybrid_pd.connector.messages import PrefillOutcome, encode
from hybrid_pd.connector.params_inbox import connect_push

log = logging.getLogger("hybrid_pd.proxy")
# How long a fresh socket gets to connect to its inbox: a connection on loopback or in a data centre takes well
# under a millisecond; one refused is retried by ZMQ every 100 ms, twice in this time. What a failed delivery
# adds to its turn's first token, against the decoder's own bound on its wait (the prefill timeout + 5 s).
CONNECT_WAIT_S = 0.25
POLL_S = 0.002  # how often a socket still connecting is tried again


class ParamsOutbox:
    def __init__(self, connect_wait_s: float = CONNECT_WAIT_S) -> None:
        self.connect_wait_s = connect_wait_s
        self._ctx: zmq.Context[zmq.Socket[bytes]] | None = None
        self._socks: dict[str, tuple[zmq.Socket[bytes], float]] = {}  # inbox -> (its socket, connecting until)

    def connect(self, inbox: str) -> None:
        """Start connecting to `inbox` ahead of a delivery there (a turn's P call is on its way)."""
        try:
            self._socket(inbox)
        except zmq.ZMQError as e:
            log.warning("early decode: cannot connect to %s: %s", inbox, e)

    async def deliver(self, inbox: str, key: str, params: dict[str, Any] | None, reason: str = "") -> bool:
        """Send P's params (None: P failed, `reason`) for transfer key `key`. True once it is on a live connection
        to the inbox; False where neither the kept socket nor a fresh one took it: then nothing was sent."""
        message = encode(PrefillOutcome(key, params, reason))
        fresh = False
        try:
            while True:
                sock, connecting_until = self._socket(inbox)
                try:
                    sock.send(message, zmq.NOBLOCK)
                    return True
                except zmq.Again:  # no live connection
                    pass
                if time.monotonic() < connecting_until:  # its connection may be on its way
                    await asyncio.sleep(POLL_S)
                    continue
                self._drop(inbox)  # not up within its time, or down since
                if fresh:
                    log.warning("early decode: could not deliver %s: no connection to %s", key, inbox)
                    return False
                fresh = True  # one more try, on a fresh socket rather than after ZMQ's reconnect timer
        except zmq.ZMQError as e:
            self._drop(inbox)
            log.warning("early decode: could not deliver %s to %s: %s", key, inbox, e)
            return False

    def close(self) -> None:
        for sock, _ in self._socks.values():
            sock.close(0)
        self._socks.clear()
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    def _socket(self, inbox: str) -> tuple[zmq.Socket[bytes], float]:
        kept = self._socks.get(inbox)
        if kept is not None:
            return kept
        if self._ctx is None:
            self._ctx = zmq.Context()
        sock = connect_push(self._ctx, inbox)
        self._socks[inbox] = (sock, time.monotonic() + self.connect_wait_s)
        return self._socks[inbox]

    def _drop(self, inbox: str) -> None:
        kept = self._socks.pop(inbox, None)
        if kept is not None:
            kept[0].close(0)
