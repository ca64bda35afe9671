"""The handshake side channel on real ZMQ sockets (127.0.0.1): what a decoder sees of a live, busy, dead,
foreign or restarted prefiller."""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import zmq

from hybrid_pd.connector.errors import HandshakeError
from hybrid_pd.connector.side_channel import SideChannelServer, fetch_handshake
from tests.support.procs import free_port


@pytest.fixture
def server():
    srv = SideChannelServer("127.0.0.1", free_port(), b"handshake-bytes")
    yield srv
    srv.close()


def port_of(srv: SideChannelServer) -> int:
    return int(srv.address.rsplit(":", 1)[1])


def test_many_decoders_at_once_all_get_the_handshake(server):
    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(lambda _: fetch_handshake("127.0.0.1", port_of(server), 5), range(64)))
    assert got == [b"handshake-bytes"] * 64


def test_nobody_listening_fails_at_once_not_at_the_timeout():
    """A dead peer's port refuses connections: that is known at once (ZMQ alone would retry until the timeout)."""
    start = time.monotonic()
    with pytest.raises(HandshakeError, match="nothing listens there"):
        fetch_handshake("127.0.0.1", free_port(), 5.0)
    assert time.monotonic() - start < 1


def test_a_port_that_is_not_a_side_channel_fails_within_the_timeout():
    with socket.socket() as s:  # a plain TCP listener that never speaks ZMQ
        s.bind(("127.0.0.1", 0))
        s.listen()
        start = time.monotonic()
        with pytest.raises(HandshakeError):
            fetch_handshake("127.0.0.1", s.getsockname()[1], 0.5)
        assert time.monotonic() - start < 3


def test_an_unexpected_message_gets_an_empty_answer_and_the_server_serves_on(server):
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 5000)
    try:
        sock.connect(server.address)
        sock.send(b"something else")
        assert sock.recv() == b""
    finally:
        sock.close(0)
    assert fetch_handshake("127.0.0.1", port_of(server), 5) == b"handshake-bytes"


def test_a_busy_port_is_refused_with_the_variable_to_change(server):
    with pytest.raises(HandshakeError, match="VLLM_NIXL_SIDE_CHANNEL_PORT"):
        SideChannelServer("127.0.0.1", port_of(server), b"other")


def test_a_restarted_prefiller_on_the_same_port_serves_its_new_handshake():
    port = free_port()
    first = SideChannelServer("127.0.0.1", port, b"engine-1")
    assert fetch_handshake("127.0.0.1", port, 5) == b"engine-1"
    first.close()
    with pytest.raises(HandshakeError):  # down: a decoder gives up at its timeout, it does not hang
        fetch_handshake("127.0.0.1", port, 0.3)
    second = SideChannelServer("127.0.0.1", port, b"engine-2")
    try:
        assert fetch_handshake("127.0.0.1", port, 5) == b"engine-2"
    finally:
        second.close()


def test_close_stops_the_serving_thread(server):
    server.close()
    assert not server._thread.is_alive()
