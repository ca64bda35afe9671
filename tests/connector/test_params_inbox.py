"""D's params inbox (connector/params_inbox.py) fed by the proxy's outbox (proxy/params_outbox.py) on real ZMQ
sockets on 127.0.0.1."""

from __future__ import annotations

import asyncio
import time

import pytest

from hybrid_pd.connector.errors import TransportError
from hybrid_pd.connector.messages import PrefillOutcome, encode
from hybrid_pd.connector.params_inbox import ParamsInbox
from hybrid_pd.proxy.params_outbox import ParamsOutbox
from tests.support.procs import free_port


@pytest.fixture
def inbox():
    box = ParamsInbox("127.0.0.1", free_port())
    yield box
    box.close()


def test_outcomes_sent_by_the_proxy_arrive_in_order_with_their_params(inbox):
    out = ParamsOutbox()
    try:
        assert asyncio.run(out.deliver(inbox.address, "a", {"remote_request_id": "p-1", "remote_block_ids": [[1, 2]]}))
        assert asyncio.run(out.deliver(inbox.address, "b", None, "prefill_timeout"))
        got: list[PrefillOutcome] = []
        deadline = time.monotonic() + 5
        while len(got) < 2 and time.monotonic() < deadline:
            got += inbox.drain(0.1)
        assert got == [
            PrefillOutcome("a", {"remote_request_id": "p-1", "remote_block_ids": [[1, 2]]}),
            PrefillOutcome("b", None, "prefill_timeout"),
        ]
    finally:
        out.close()


def test_waiting_on_an_empty_inbox_returns_after_the_wait(inbox):
    began = time.monotonic()
    assert inbox.drain(0.05) == []
    assert 0.04 <= time.monotonic() - began < 1
    assert inbox.drain() == []


def test_a_message_of_another_version_or_shape_is_dropped_not_raised(inbox):
    import zmq

    sock = zmq.Context.instance().socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(inbox.address)
    try:
        sock.send(b"not msgpack at all")
        sock.send(encode(PrefillOutcome("old", None, version=0)))
        sock.send(encode(PrefillOutcome("ok")))
        got: list[PrefillOutcome] = []
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            got += inbox.drain(0.1)
        assert got == [PrefillOutcome("ok")]
    finally:
        sock.close(0)


def test_a_busy_port_is_refused_with_the_setting_to_change(inbox):
    port = int(inbox.address.rsplit(":", 1)[1])
    with pytest.raises(TransportError, match="HYBRID_PD_PARAMS_PORT"):
        ParamsInbox("127.0.0.1", port)
