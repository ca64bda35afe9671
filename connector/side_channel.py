"""The handshake side channel: each worker serves its `Handshake` on ZMQ; peers fetch it with a timeout.

One ROUTER socket per worker on `host:port + tp_rank`, answered from a daemon thread. ZMQ errors are mapped
to `HandshakeError` here, the only place the connector touches ZMQ.
"""

from __future__ import annotations

import logging
import socket
import threading

import zmq

from hybrid_pd.connector.errors import HandshakeError, HandshakeTimeout, PeerGone

log = logging.getLogger("vllm." + __name__)  # under vLLM's configured logger
GET = b"hybrid-pd/handshake"


class SideChannelServer:
    """Answers every GET with the same handshake bytes until `close()`."""

    def __init__(self, host: str, port: int, payload: bytes):
        self.address = f"tcp://{host}:{port}"
        self._payload = payload
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        try:
            self._sock.bind(self.address)
        except zmq.ZMQError as e:
            self._ctx.destroy(linger=0)
            raise HandshakeError(
                f"cannot serve the side channel on {self.address}: {e} (is VLLM_NIXL_SIDE_CHANNEL_PORT free?)"
            ) from e
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="hybrid-pd-side-channel", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        while not self._stop.is_set():
            try:
                if not poller.poll(200):
                    continue
                identity, _, msg = self._sock.recv_multipart()
                if msg == GET:
                    self._sock.send_multipart([identity, b"", self._payload])
                else:
                    log.warning("side channel %s: unexpected message %r", self.address, msg[:40])
                    self._sock.send_multipart([identity, b"", b""])
            except zmq.ZMQError as e:
                if not self._stop.is_set():
                    log.error("side channel %s: %s", self.address, e)
                return
            except Exception:  # noqa: BLE001  top of a background loop: log, keep serving
                log.exception("side channel %s", self.address)
        self._sock.close(0)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self._ctx.term() if not self._thread.is_alive() else None


def fetch_handshake(host: str, port: int, timeout_s: float = 5.0) -> bytes:
    """Ask the worker at host:port for its handshake; HandshakeError if it does not answer in time, at once if
    nothing listens there (ZMQ would retry a refused connection silently until the timeout: a dead prefiller
    cost every decoder that asked 5 s before it computed the prompt itself)."""
    _refuse_fast(host, port, min(timeout_s, 1.0))
    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, int(timeout_s * 1000))
    sock.setsockopt(zmq.SNDTIMEO, int(timeout_s * 1000))
    try:
        sock.connect(f"tcp://{host}:{port}")
        sock.send(GET)
        data = sock.recv()
    except zmq.ZMQError as e:
        raise HandshakeTimeout(f"no handshake from {host}:{port} within {timeout_s:g} s: {e}") from e
    finally:
        sock.close(0)
    if not data:
        raise HandshakeError(f"{host}:{port} is not a hybrid-pd side channel")
    return data


def _refuse_fast(host: str, port: int, timeout_s: float) -> None:
    """HandshakeError if host:port refuses a TCP connection; anything else (even a slow answer) is ZMQ's to judge."""
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except ConnectionRefusedError as e:
        raise PeerGone(f"no handshake from {host}:{port}: nothing listens there ({e})") from e
    except OSError:
        pass
