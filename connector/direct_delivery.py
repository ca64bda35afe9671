"""P's params straight to the decoder's params inbox (the proxy's --early-decode): pushed from P's engine core the
moment they are final, not delivered by the proxy once P's HTTP answer has reached it.

Where the proxy sent D a turn's request early, it names D's inbox and the turn's transfer key in P's
kv_transfer_params (contract.DELIVER_TO: [address, key]). P connects to that inbox when the request arrives (one
PUSH socket per inbox, kept), and pushes a PrefillOutcome once the params are final: at once, or, with digests on,
at the end of the step's output, after the digests joined them (vllm_glue.update_connector_output). A push goes only
onto a live connection (ZMQ_IMMEDIATE) and never blocks the engine's step; where it went, P's answer says so
(contract.DELIVERED) and the proxy does not deliver again. Where it did not, the proxy delivers as it did before. A
decoder that hears the same params twice takes them once (awaiting.py). What it saves: P's output processing, its
API server's answer and the proxy's hop (10-15 ms of a PD turn on the GPU runs: the p call beyond P's prefill).
ZMQ errors are mapped to False here.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

import zmq

from hybrid_pd.connector.contract import DELIVER_TO, DELIVERED
from hybrid_pd.connector.messages import PrefillOutcome, encode
from hybrid_pd.connector.params_inbox import connect_push

log = logging.getLogger("vllm." + __name__)  # under vLLM's configured logger
KEEP_SOCKETS = 64  # inboxes kept connected (one per decoder); the least recently used beyond that is closed


def target(params: dict) -> tuple[str, str] | None:
    """(inbox address, transfer key) the proxy named in P's params, or None (none named, or not a tcp address)."""
    named = params.get(DELIVER_TO)
    if not isinstance(named, (list, tuple)) or len(named) != 2 or not all(isinstance(x, str) for x in named):
        return None
    address, key = named
    return (address, key) if address.startswith("tcp://") and key else None


class Sender:
    """PUSH sockets to decoders' params inboxes, kept per address."""

    def __init__(self, keep: int = KEEP_SOCKETS):
        self.keep = keep
        self._ctx: zmq.Context[zmq.Socket[bytes]] | None = None
        self._socks: OrderedDict[str, zmq.Socket[bytes]] = OrderedDict()

    def connect(self, address: str) -> None:
        """Start connecting to `address` (the connection comes up while P computes)."""
        try:
            self._socket(address)
        except zmq.ZMQError as e:
            log.warning("params to %s: cannot connect: %s", address, e)

    def send(self, address: str, message: bytes) -> bool:
        """True once `message` is on a live connection to `address`; False (nothing sent) otherwise."""
        try:
            self._socket(address).send(message, zmq.NOBLOCK)
            return True
        except zmq.Again:  # not connected (yet, or any more): the proxy delivers
            return False
        except zmq.ZMQError as e:
            self._drop(address)
            log.warning("params to %s: %s", address, e)
            return False

    def close(self) -> None:
        for address in list(self._socks):
            self._drop(address)
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    def _socket(self, address: str) -> zmq.Socket[bytes]:
        sock = self._socks.get(address)
        if sock is not None:
            self._socks.move_to_end(address)
            return sock
        if self._ctx is None:
            self._ctx = zmq.Context()
        sock = connect_push(self._ctx, address)
        self._socks[address] = sock
        while len(self._socks) > self.keep:
            self._drop(next(iter(self._socks)))
        return sock

    def _drop(self, address: str) -> None:
        sock = self._socks.pop(address, None)
        if sock is not None:
            sock.close(0)


class Deliveries:
    """P's side: which finished requests' params go straight to a decoder, and their pushes."""

    def __init__(self, sender: Sender | None = None):
        self.sender = sender if sender is not None else Sender()
        self._pending: dict[str, tuple[str, str, dict]] = {}  # request id -> (inbox, key, the params P returns)

    def arrived(self, params: dict) -> None:
        """A P request: connect to the inbox it names, if any."""
        named = target(params)
        if named is not None:
            self.sender.connect(named[0])

    def finished(self, request_id: str, params: dict, out: dict, final: bool) -> None:
        """P returned `out` for a request whose params were `params`; `final`: nothing joins them later (no
        digests), so push now; else at `flush`."""
        named = target(params)
        if named is None:
            return
        self._pending[request_id] = (*named, out)
        if final:
            self.flush()

    def flush(self) -> None:
        """Push every pending request's params; mark those that went (P's answer then tells the proxy)."""
        for address, key, out in self._pending.values():
            if self.sender.send(address, encode(PrefillOutcome(key, dict(out)))):
                out[DELIVERED] = True
        self._pending.clear()

    def close(self) -> None:
        self.sender.close()
