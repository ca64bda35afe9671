"""D's early-decode bookkeeping (connector/awaiting.py): every path of a key, with the time passed in."""

from hybrid_pd.connector.awaiting import Awaiting, Verdict
from hybrid_pd.connector.messages import PrefillOutcome

P = {"remote_request_id": "p-1"}


def test_params_delivered_while_the_request_waits_end_its_wait():
    w = Awaiting(keep_s=60)
    assert w.ask("k", 5, now=0) is None and len(w) == 1
    assert w.ask("k", 5, now=1) is None
    w.deliver(PrefillOutcome("k", P), now=2)
    assert w.ask("k", 5, now=2) == Verdict(P) and len(w) == 0
    assert w.orphans == []


def test_params_that_come_before_the_request_are_kept_for_it():
    w = Awaiting(keep_s=60)
    w.deliver(PrefillOutcome("k", P), now=0)
    assert w.ask("k", 5, now=59) == Verdict(P)


def test_a_failed_prefill_ends_the_wait_with_its_reason():
    w = Awaiting(keep_s=60)
    assert w.ask("k", 5, now=0) is None
    w.deliver(PrefillOutcome("k", None, "prefill_5xx"), now=1)
    assert w.ask("k", 5, now=1) == Verdict(None, "prefill_5xx")


def test_outcomes_go_to_their_own_key_only():
    w = Awaiting(keep_s=60)
    assert w.ask("a", 5, now=0) is None and w.ask("b", 5, now=0) is None
    w.deliver(PrefillOutcome("b", P), now=1)
    assert w.ask("a", 5, now=1) is None
    assert w.ask("b", 5, now=1) == Verdict(P)


def test_a_wait_past_its_bound_gives_up_and_the_late_params_are_an_orphan():
    w = Awaiting(keep_s=60)
    assert w.ask("k", 5, now=0) is None
    assert w.ask("k", 5, now=4.9) is None
    verdict = w.ask("k", 5, now=5)
    assert verdict is not None and verdict.params is None and "5 s" in verdict.reason and len(w) == 0
    w.deliver(PrefillOutcome("k", P), now=6)
    assert w.orphans == [P]


def test_an_aborted_request_turns_its_params_into_an_orphan_whenever_they_come():
    w = Awaiting(keep_s=60)
    assert w.ask("early", 5, now=0) is None
    w.abandon("early", now=1)
    w.deliver(PrefillOutcome("early", P), now=2)
    w.deliver(PrefillOutcome("late", P), now=2)
    w.abandon("late", now=3)
    assert w.orphans == [P, P] and len(w) == 0


def test_params_no_request_asks_for_expire_into_orphans_and_failures_leave_none():
    w = Awaiting(keep_s=10)
    w.deliver(PrefillOutcome("k", P), now=0)
    w.deliver(PrefillOutcome("f", None, "prefill_timeout"), now=0)
    w.expire(now=9.9)
    assert w.orphans == []
    w.expire(now=10)
    assert w.orphans == [P]
    assert w.ask("k", 5, now=11) is None  # its params went to P as freed: it waits, then computes


def test_a_second_outcome_for_one_key_is_a_stray():
    w = Awaiting(keep_s=60)
    w.deliver(PrefillOutcome("k", P), now=0)
    w.deliver(PrefillOutcome("k", {"remote_request_id": "p-2"}), now=0)
    assert w.orphans == [{"remote_request_id": "p-2"}]
    assert w.ask("k", 5, now=0) == Verdict(P)


def test_the_same_params_twice_under_one_key_are_taken_once():
    """P pushes its params to D's inbox itself (direct_delivery.py) and the proxy may deliver them again: before
    the request asks, and after it took them, the second is neither a second verdict nor an orphan (P would free
    the blocks D reads)."""
    w = Awaiting(keep_s=60)
    w.deliver(PrefillOutcome("k", P), now=0)
    w.deliver(PrefillOutcome("k", dict(P)), now=0)
    assert w.ask("k", 5, now=0) == Verdict(P)
    w.deliver(PrefillOutcome("k", dict(P)), now=1)
    w.expire(now=100)
    assert w.orphans == [] and w.ask("j", 5, now=100) is None
    w.deliver(PrefillOutcome("k", dict(P)), now=101)  # past its memory: an orphan, as any params nobody asks for
    w.expire(now=200)
    assert w.orphans == [P]


def test_params_twice_for_a_wait_given_up_are_released_once():
    """A wait that gave up before P's params came: the first copy is an orphan (P frees), the second (the other
    deliverer's) nothing more; another prefill's params under that key are still a stray of their own."""
    w = Awaiting(keep_s=60)
    assert w.ask("k", 1, now=0) is None
    assert w.ask("k", 1, now=2) == Verdict(None, "no prefill outcome within 1 s")
    w.deliver(PrefillOutcome("k", P), now=3)
    w.deliver(PrefillOutcome("k", dict(P)), now=3)
    w.deliver(PrefillOutcome("k", {"remote_request_id": "p-2"}), now=3)
    assert w.orphans == [P, {"remote_request_id": "p-2"}]
