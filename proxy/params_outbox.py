"""The proxy's side of early decode (--early-decode): the outcome of P's call, delivered to the decoder that was sent
the request early, at that decoder's params inbox (connector/params_inbox.py, advertised as --decode-inbox).

One ZMQ PUSH socket per inbox address, connected on first use and kept; a send never blocks the event loop (ZMQ
queues it for a decoder still connecting). A delivery that cannot even be queued is reported, and the decoder's
own bound on its wait then ends it (it computes the prompt itself). ZMQ errors are mapped here, to False.
"""

from __future__ import annotations

import logging
from typing import Any

import zmq

from hybrid_pd.connector.messages import PrefillOutcome, encode

log = logging.getLogger("hybrid_pd.proxy")


class ParamsOutbox:
    def __init__(self) -> None:
        self._ctx: zmq.Context[zmq.Socket[bytes]] | None = None
        self._socks: dict[str, zmq.Socket[bytes]] = {}

    def deliver(self, inbox: str, key: str, params: dict[str, Any] | None, reason: str = "") -> bool:
        """Send P's params (None: P failed, `reason`) for transfer key `key`; False if it could not be queued."""
        try:
            sock = self._socks.get(inbox)
            if sock is None:
                if self._ctx is None:
                    self._ctx = zmq.Context()
                sock = self._ctx.socket(zmq.PUSH)
                sock.setsockopt(zmq.LINGER, 0)
                sock.connect(inbox)
                self._socks[inbox] = sock
            sock.send(encode(PrefillOutcome(key, params, reason)), zmq.NOBLOCK)
            return True
        except zmq.ZMQError as e:
            log.warning("early decode: could not deliver %s to %s: %s", key, inbox, e)
            return False

    def close(self) -> None:
        for sock in self._socks.values():
            sock.close(0)
        self._socks.clear()
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None
