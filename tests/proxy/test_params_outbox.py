"""The proxy's outbox (proxy/params_outbox.py) on real ZMQ sockets on 127.0.0.1: a delivery goes only onto a live
connection to the inbox, waits a little for a fresh socket's connection, and is tried once more on a fresh socket
where the kept one's connection is down; one that fails says so, soon, and leaves nothing queued."""

from __future__ import annotations

import asyncio
import time

from hybrid_pd.connector.messages import PrefillOutcome
from hybrid_pd.connector.params_inbox import ParamsInbox
from hybrid_pd.proxy.params_outbox import ParamsOutbox
from tests.support.procs import free_port

WAIT_S = 0.2


def arrived(inbox: ParamsInbox, n: int = 1, within_s: float = 5.0) -> list[PrefillOutcome]:
    got: list[PrefillOutcome] = []
    deadline = time.monotonic() + within_s
    while len(got) < n and time.monotonic() < deadline:
        got += inbox.drain(0.05)
    return got


def test_a_delivery_to_an_inbox_nobody_listens_on_fails_soon_and_leaves_nothing_queued():
    port = free_port()
    out = ParamsOutbox(connect_wait_s=WAIT_S)
    try:
        began = time.monotonic()
        assert not asyncio.run(out.deliver(f"tcp://127.0.0.1:{port}", "k", {"remote_request_id": "p-1"}))
        assert WAIT_S <= time.monotonic() - began < 1.0
        late = ParamsInbox("127.0.0.1", port)  # a decoder that comes up afterwards gets nothing stale
        try:
            assert arrived(late, within_s=0.5) == []
        finally:
            late.close()
    finally:
        out.close()


def test_an_inbox_that_restarted_gets_the_delivery_on_a_fresh_socket():
    port = free_port()
    out = ParamsOutbox(connect_wait_s=WAIT_S)
    first = ParamsInbox("127.0.0.1", port)
    try:
        assert asyncio.run(out.deliver(first.address, "a", None, "r"))
        assert arrived(first) == [PrefillOutcome("a", None, "r")]
        first.close()
        time.sleep(0.3)  # the kept socket sees its connection go; ZMQ would reconnect it on its own timer
        again = ParamsInbox("127.0.0.1", port)
        try:
            assert asyncio.run(out.deliver(again.address, "b", {"remote_request_id": "p-2"}))
            assert arrived(again) == [PrefillOutcome("b", {"remote_request_id": "p-2"})]
        finally:
            again.close()
    finally:
        out.close()


def test_a_new_socket_waits_for_its_connection_to_an_inbox_coming_up():
    port = free_port()
    out = ParamsOutbox(connect_wait_s=2.0)
    boxes: list[ParamsInbox] = []

    async def body() -> bool:
        asyncio.get_running_loop().call_later(0.15, lambda: boxes.append(ParamsInbox("127.0.0.1", port)))
        return await out.deliver(f"tcp://127.0.0.1:{port}", "k", None, "r")

    try:
        assert asyncio.run(body())
        assert arrived(boxes[0]) == [PrefillOutcome("k", None, "r")]
    finally:
        out.close()
        for box in boxes:
            box.close()


def test_an_address_zmq_refuses_fails_at_once():
    out = ParamsOutbox(connect_wait_s=WAIT_S)
    try:
        began = time.monotonic()
        assert not asyncio.run(out.deliver("nonsense://nowhere", "k", None))
        assert time.monotonic() - began < WAIT_S
    finally:
        out.close()
