"""P's params pushed straight to an early decoder's params inbox (connector/direct_delivery.py), from the scheduler
half (connector/scheduler_side.py) to a real ParamsInbox on 127.0.0.1."""

from __future__ import annotations

import time

from hybrid_pd.connector.contract import DELIVER_TO, DELIVERED
from hybrid_pd.connector.direct_delivery import Deliveries, target
from hybrid_pd.connector.params_inbox import ParamsInbox
from hybrid_pd.connector.scheduler_side import SchedulerSide
from tests.connector.test_sides import GROUPS, FakeStore, request
from tests.support.procs import free_port


def finished(p: SchedulerSide, address: str, key: str, req_id: str = "r1") -> dict:
    """A P request naming `address` and `key`, computed and finished: the params P returns."""
    req = request(11, {"do_remote_decode": True, DELIVER_TO: [address, key]}, req_id)
    req.num_computed_tokens = p.on_new_request(req)  # where P stops: computed
    time.sleep(0.1)  # the connection comes up while P computes
    ok, out = p.request_finished(req, ([0, 0, 3], [5, 6, 7]), finished_ok=True)
    assert ok and out is not None
    return out


def test_p_pushes_its_final_params_to_the_inbox_and_says_so():
    inbox = ParamsInbox("127.0.0.1", free_port())
    p = SchedulerSide(engine_id="P", host="h", port=7, groups=GROUPS, lease_s=9, checkpoints=FakeStore())
    try:
        out = finished(p, inbox.address, "key-1")
        (got,) = inbox.drain(wait_s=2)
        assert got.key == "key-1" and got.params["remote_request_id"] == "r1" and DELIVERED not in got.params
        assert out[DELIVERED] is True and got.params == {k: v for k, v in out.items() if k != DELIVERED}
    finally:
        p.direct.close()
        inbox.close()


def test_with_digests_on_p_pushes_once_they_joined_the_params():
    inbox = ParamsInbox("127.0.0.1", free_port())
    p = SchedulerSide(engine_id="P", host="h", port=7, groups=GROUPS, lease_s=9, checkpoints=FakeStore(),
                      digests=True)
    try:
        out = finished(p, inbox.address, "key-2")
        assert inbox.drain(wait_s=0.3) == [] and DELIVERED not in out  # not final yet
        out["digests"] = {"algorithm": "x", "ranks": []}  # (what on_digests adds)
        p.direct.flush()  # the glue, at its step's output end
        (got,) = inbox.drain(wait_s=2)
        assert got.params["digests"] == out["digests"] and out[DELIVERED] is True
    finally:
        p.direct.close()
        inbox.close()


def test_where_no_inbox_listens_nothing_is_marked_and_the_proxy_delivers():
    p = Deliveries()
    try:
        out = {"remote_request_id": "r1"}
        p.arrived({DELIVER_TO: [f"tcp://127.0.0.1:{free_port()}", "k"]})
        time.sleep(0.1)
        p.finished("r1", {DELIVER_TO: [f"tcp://127.0.0.1:{free_port()}", "k"]}, out, final=True)
        assert DELIVERED not in out
    finally:
        p.close()


def test_only_a_tcp_address_and_a_key_name_a_target():
    assert target({DELIVER_TO: ["tcp://10.0.0.1:5000", "k"]}) == ("tcp://10.0.0.1:5000", "k")
    for bad in (None, "tcp://h:1", ["tcp://h:1"], ["ipc:///tmp/x", "k"], ["tcp://h:1", ""], ["tcp://h:1", 3]):
        assert target({DELIVER_TO: bad}) is None
    assert target({}) is None
