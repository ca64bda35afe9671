"""Every error the connector raises, as one tree; foreign errors are mapped at one boundary each.

    ConnectorError
    ├── ConfigurationError      start-up check failed (e.g. conv-state layout is not DS)
    ├── ProtocolError           a wire message we cannot use
    │   ├── BadTransferParams   kv_transfer_params in a request are malformed
    │   └── IncompatiblePeer    handshake: other protocol version or KV layout (says what differs)
    ├── PlanError               P's and D's block lists cannot describe the transfer
    ├── DigestMismatch          landed KV blocks differ from the prefiller's digests of them
    └── TransportError          NIXL / ZMQ failed (mapped in transport.py, side_channel.py and params_inbox.py only)
        └── HandshakeError      the peer's side channel did not answer
            ├── PeerGone        nothing listens there: the peer is down (no use asking again)
            └── HandshakeTimeout    it listens but did not answer in time (starved? asked again)

The worker never lets one of these escape into vLLM for a single request: it logs it and reports the
request as a failed load (vLLM then recomputes it, `kv_load_failure_policy: recompute`). A READ that passes its
deadline raises nothing: worker_side.py polls it, and past the deadline reports the load failed the same way.
"""

from __future__ import annotations


class ConnectorError(Exception):
    """Base of every hybrid-pd connector error."""


class ConfigurationError(ConnectorError):
    pass


class ProtocolError(ConnectorError):
    pass


class BadTransferParams(ProtocolError):
    pass


class IncompatiblePeer(ProtocolError):
    pass


class PlanError(ConnectorError, ValueError):
    pass


class DigestMismatch(ConnectorError):
    pass


class TransportError(ConnectorError):
    pass


class HandshakeError(TransportError):
    pass


class PeerGone(HandshakeError):
    pass


class HandshakeTimeout(HandshakeError):
    pass
