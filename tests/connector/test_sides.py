"""The connector's scheduler half without vLLM (connector/scheduler_side.py): fake requests and a fake
checkpoint store. The worker half is in test_worker_side.py."""

import itertools
from types import SimpleNamespace

from hybrid_pd.connector.contract import (
    AWAIT_PREFILL,
    AWAIT_S,
    PREFILL_STOP,
    SHIP_CHECKPOINT,
    STOP_BOUNDARY,
    STOP_LAST,
)
from hybrid_pd.connector.messages import (
    PROTOCOL_VERSION,
    PrefillOutcome,
)
from hybrid_pd.connector.plan import GroupSpec, Run
from hybrid_pd.connector.scheduler_side import SchedulerSide
from hybrid_pd.connector.vllm_request import truncate_prompt

GROUPS = [GroupSpec("mamba", 4), GroupSpec("attention", 4)]
PAGE, STATE, NBLOCKS = 64, 40, 16
_names = itertools.count()


def request(n_prompt: int, params: dict | None, req_id: str = "r1") -> SimpleNamespace:
    tokens = list(range(n_prompt))
    return SimpleNamespace(request_id=req_id, kv_transfer_params=params, prompt_token_ids=tokens,
                           _all_token_ids=list(tokens), num_prompt_tokens=n_prompt, max_tokens=16,
                           num_computed_tokens=0)


class FakeStore:
    def __init__(self):
        self.pinned, self.released, self.registered, self.kept, self.next = [], [], [], [], 100

    def pin(self, request, group, tokens):
        self.pinned.append((group, tokens))
        return 50, tokens

    def reserve(self, group):
        self.next += 1
        return self.next

    def register(self, request, group, block_id, tokens):
        self.registered.append((group, block_id, tokens))

    def keep(self, request, group, block_id, tokens):
        self.kept.append((group, block_id, tokens))

    def release(self, block_ids):
        self.released += list(block_ids)


def test_prefiller_stops_at_the_last_block_boundary_below_the_prompts_end():
    """One engine step on P (no tail step); the state D resumes from is an aligned checkpoint itself."""
    p = SchedulerSide(engine_id="P", host="h", port=7, groups=GROUPS, lease_s=9, checkpoints=FakeStore())
    for n, keep in ((11, 8), (12, 8), (13, 12), (9, 8), (5, 4), (4, 3), (3, 2)):  # aligned N: a block back
        req = request(n, {"do_remote_decode": True})
        assert p.on_new_request(req) == keep, n
        truncate_prompt(req, keep)
        assert req.num_prompt_tokens == keep == len(req.prompt_token_ids) == len(req._all_token_ids)
        assert p.on_new_request(req) == 0  # once (preemption)
    req = request(11, {"do_remote_decode": True})
    p.on_new_request(req)
    truncate_prompt(req, 8)
    req.num_computed_tokens = 8
    delay, params = p.request_finished(req, ([0, 3], [5, 6]), finished_ok=True)
    assert delay and params["remote_num_tokens"] == 8 and params["checkpoints"] == []  # nothing extra crosses
    assert params["engine_splits"] is False  # as built: the proxy hears whether P's engine splits at a boundary
    splits = SchedulerSide(engine_id="P", host="h", port=7, groups=GROUPS, engine_splits=True)
    req = request(11, {"do_remote_decode": True})
    truncate_prompt(req, splits.on_new_request(req))
    req.num_computed_tokens = 8
    assert splits.request_finished(req, ([0, 3], [5, 6]), finished_ok=True)[1]["engine_splits"] is True
    attention_only = SchedulerSide(engine_id="P", host="h", port=7, groups=[GroupSpec("attention", 4)])
    assert attention_only.on_new_request(request(11, {"do_remote_decode": True})) == 10  # N-1: no split there


def test_the_request_chooses_where_the_prefiller_stops():
    """The proxy's placement picks P's stop per turn (PREFILL_STOP): N-1 when D's streams would wait for the
    tail's step, the boundary otherwise; either way over the engine's own setting. Attention-only: N-1 always."""
    for default in (True, False):
        p = SchedulerSide(engine_id="P", host="h", port=7, groups=GROUPS, prefill_to_boundary=default)
        assert p.on_new_request(request(11, {"do_remote_decode": True, PREFILL_STOP: STOP_LAST})) == 10
        assert p.on_new_request(request(11, {"do_remote_decode": True, PREFILL_STOP: STOP_BOUNDARY})) == 8
        assert p.on_new_request(request(11, {"do_remote_decode": True})) == (8 if default else 10)
    attention_only = SchedulerSide(engine_id="P", host="h", port=7, groups=[GroupSpec("attention", 4)])
    asked = {"do_remote_decode": True, PREFILL_STOP: STOP_BOUNDARY}
    assert attention_only.on_new_request(request(11, asked)) == 10
    assert attention_only.on_new_request(request(11, {"do_remote_decode": True, PREFILL_STOP: 6})) == 10


def test_a_junction_stop_leaves_the_prefiller_at_the_boundary_below_it():
    """A token position as the stop (where the next turn is expected to diverge): P stops at the aligned block
    boundary at or below it (never past N-1); one below the first boundary, or not a count, is not a junction."""
    p = SchedulerSide(engine_id="P", host="h", port=7, groups=GROUPS)
    for stop, keep in ((6, 4), (8, 8), (9, 8), (40, 8), (3, 8), (True, 8), ("6", 8)):
        assert p.on_new_request(request(11, {"do_remote_decode": True, PREFILL_STOP: stop})) == keep, stop


def test_at_a_junction_the_state_p_stopped_at_crosses_as_a_checkpoint_too():
    """D resumes from it and goes on computing its prompt, so vLLM would not keep it on D: it crosses as a
    checkpoint for D to register. At the last boundary (the default stop) nothing extra crosses."""
    store = FakeStore()
    p = SchedulerSide(engine_id="P", host="h", port=7, groups=GROUPS, lease_s=9, checkpoints=store)
    for stop, blocks, shipped in ((6, ([7], [5]), [(0, 7, 4)]), (STOP_BOUNDARY, ([0, 3], [5, 6]), [])):
        req = request(11, {"do_remote_decode": True, PREFILL_STOP: stop}, req_id=f"r{stop}")
        keep = p.on_new_request(req)
        truncate_prompt(req, keep)
        req.num_computed_tokens = keep
        _, params = p.request_finished(req, blocks, finished_ok=True)
        crossing = [(c["group"], c["block"], c["tokens"]) for c in params["checkpoints"]]
        assert params["remote_num_tokens"] == keep and crossing == shipped, stop
    assert store.pinned == []  # the request's own state block: held for D's READ with the rest of its blocks


def test_prefiller_cuts_one_token_and_returns_params_with_a_pinned_checkpoint():
    """HYBRID_PD_PREFILL_TO_BOUNDARY=0: P computes N-1 tokens and ships the checkpoint below them."""
    store = FakeStore()
    p = SchedulerSide(engine_id="P", host="h", port=7, groups=GROUPS, lease_s=9, checkpoints=store,
                      prefill_to_boundary=False)
    req = request(11, {"do_remote_decode": True})
    assert p.on_new_request(req) == 10
    truncate_prompt(req, 10)
    assert not p.on_new_request(req)  # once (preemption)
    assert req.num_prompt_tokens == 10 and len(req.prompt_token_ids) == 10 and req.max_tokens == 1
    req.num_computed_tokens = 10
    delay, params = p.request_finished(req, ([0, 0, 3], [5, 6, 7]), finished_ok=True)
    assert delay and params["remote_block_ids"] == [[0, 0, 3], [5, 6, 7]] and params["remote_num_tokens"] == 10
    assert params["checkpoints"] == [{"group": 0, "block": 50, "tokens": 8}] and store.pinned == [(0, 8)]
    assert p.build_meta().leases == {"r1": 9}
    p.on_transfer_results({"r1"}, set(), set())
    assert store.released == [50]
    # an aborted prefill frees at once and returns nothing
    req2 = request(11, {"do_remote_decode": True}, "r2")
    assert p.request_finished(req2, ([1], [2]), finished_ok=False) == (False, None)


def test_a_prefiller_told_no_next_turn_comes_to_the_decoder_ships_no_checkpoint():
    """The proxy's always-remote policy marks P's request (SHIP_CHECKPOINT False): at N-1, or at a junction, P pins
    and ships no aligned checkpoint beside the state D resumes from; unmarked, it does."""
    below = [{"group": 0, "block": 50, "tokens": 8}]  # the checkpoint at 8, below P's stop at 10
    for mark, shipped in ((False, []), (True, below), (None, below)):  # None: no mark
        store = FakeStore()
        p = SchedulerSide(engine_id="P", host="h", port=7, groups=GROUPS, lease_s=9, checkpoints=store)
        params = {"do_remote_decode": True, PREFILL_STOP: STOP_LAST}
        if mark is not None:
            params[SHIP_CHECKPOINT] = mark
        req = request(11, params)
        assert p.on_new_request(req) == 10
        req.num_computed_tokens = 10
        _, out = p.request_finished(req, ([0, 0, 3], [5, 6, 7]), finished_ok=True)
        assert out["checkpoints"] == shipped and store.pinned == [(0, 8)] * len(shipped)


def test_prefiller_params_carry_each_ranks_handshake_through_json():
    """The workers' handshakes reach the scheduler side at start-up and ride in every kv_transfer_params, through
    the proxy's JSON (bytes as base64) back to the bytes D decodes; ranks that are not 0..n-1 are not carried."""
    import json

    from hybrid_pd.connector.messages import parse_remote_prefill

    p = SchedulerSide(engine_id="P", host="h", port=7, groups=GROUPS)
    p.set_handshakes({1: b"rank-1\x00\xff", 0: b"rank-0"})
    req = request(11, {"do_remote_decode": True})
    req.num_computed_tokens = 10
    _, params = p.request_finished(req, ([0, 0, 3], [5, 6, 7]), finished_ok=True)
    wire = json.loads(json.dumps(params | {"do_remote_prefill": True, "do_remote_decode": False}))
    assert parse_remote_prefill(wire).handshakes == [b"rank-0", b"rank-1\x00\xff"]
    p.set_handshakes({0: b"a", 2: b"c"})  # a rank missing: D asks the side channels
    assert p.handshakes == [b"rank-0", b"rank-1\x00\xff"]
    p2 = SchedulerSide(engine_id="P", host="h", port=7, groups=GROUPS)
    p2.set_handshakes({0: b"a", 2: b"c"})
    assert p2.handshakes == []


def test_prefiller_leaves_its_handshakes_out_for_a_decoder_that_knows_this_engine():
    """The proxy names the engine id whose handshake the chosen decoder holds: P's own id leaves the handshakes
    out; another id (P restarted since) keeps them."""
    from hybrid_pd.connector.contract import DECODER_KNOWS

    p = SchedulerSide(engine_id="P2", host="h", port=7, groups=GROUPS)
    p.set_handshakes({0: b"rank-0"})
    carried = []
    for knows in ("P2", "P1", None):
        req = request(11, {"do_remote_decode": True, DECODER_KNOWS: knows}, req_id=f"r-{knows}")
        req.num_computed_tokens = 10
        _, params = p.request_finished(req, ([0, 0, 3], [5, 6, 7]), finished_ok=True)
        carried.append(params["handshakes"])
    assert [bool(h) for h in carried] == [False, True, True]  # (the bytes as base64 text: to_params)


def remote_params(**over) -> dict:
    base = dict(remote_engine_id="P", remote_request_id="p-r1", remote_host="h", remote_port=7,
                remote_block_ids=[[0, 0, 3], [5, 6, 7]], remote_num_tokens=10, lease_s=9,
                checkpoints=[{"group": 0, "block": 50, "tokens": 8}], do_remote_prefill=True,
                do_remote_decode=False, hybrid_pd_version=PROTOCOL_VERSION)
    return {**base, **over}


def test_decoder_matches_plans_and_registers_the_checkpoint_on_success():
    store = FakeStore()
    d = SchedulerSide(engine_id="D", host="h", port=8, groups=GROUPS, checkpoints=store)
    req = request(11, remote_params())
    assert d.get_num_new_matched_tokens(req, 4) == (6, True)
    assert d.get_num_new_matched_tokens(req, 4) == (6, True)  # side-effect free
    d.update_state_after_alloc(req, ([9, 0, 12], [20, 21, 22]), num_external_tokens=6)
    (job,) = d.build_meta().loads
    assert job.plan.runs == (Run(0, 101, 50), Run(0, 12, 3), Run(1, 21, 6, 2))
    assert req.kv_transfer_params["do_remote_prefill"] is False
    assert d.get_num_new_matched_tokens(req, 0) == (0, False)  # one transfer per request
    d.on_transfer_results(set(), {"r1"}, set())
    assert store.registered == [(0, 101, 8)] and store.released == [101]


def test_decoder_rewinds_a_failed_load_to_its_local_hit_and_registers_no_checkpoint():
    """vLLM < 0.32 reports a failed load as finished: the request must resume from D's own hit (4 tokens),
    not from the 10 tokens vLLM set when it planned the load."""
    store = FakeStore()
    d = SchedulerSide(engine_id="D", host="h", port=8, groups=GROUPS, checkpoints=store)
    req, other = request(11, remote_params()), request(11, remote_params(), "r2")
    d.update_state_after_alloc(req, ([9, 0, 12], [20, 21, 22]), num_external_tokens=6)
    d.update_state_after_alloc(other, ([9, 0, 13], [20, 21, 23]), num_external_tokens=6)
    req.num_computed_tokens = other.num_computed_tokens = 10
    d.rewind_failed_loads({"r1", "unknown"})
    d.on_transfer_results(set(), {"r1", "r2"}, {"r1"})
    assert req.num_computed_tokens == 4 and other.num_computed_tokens == 10
    assert store.registered == [(0, 102, 8)]  # r2's checkpoint only
    req.num_computed_tokens = 7
    d.rewind_failed_loads({"r1"})  # finished: forgotten
    assert req.num_computed_tokens == 7


def test_decoder_tells_the_prefiller_to_free_when_it_reads_nothing_or_never_schedules():
    d = SchedulerSide(engine_id="D", host="h", port=8, groups=GROUPS)
    full_hit = request(11, remote_params())
    d.update_state_after_alloc(full_hit, ([0, 0, 1], [1, 2, 3]), num_external_tokens=0)
    aborted = request(11, remote_params(), "r2")
    assert d.request_finished(aborted, ([], []), finished_ok=False) == (False, None)
    jobs = d.build_meta().loads
    assert [(j.request_id, j.plan) for j in jobs] == [("r1", None), ("r2", None)]


def test_decoder_fails_a_request_whose_lists_do_not_fit():
    d = SchedulerSide(engine_id="D", host="h", port=8, groups=GROUPS)
    req = request(11, remote_params(remote_block_ids=[[0, 3], [5]]))
    d.update_state_after_alloc(req, ([0, 0, 12], [20, 21, 22]), num_external_tokens=10)
    (job,) = d.build_meta().loads
    assert job.fail and job.plan is None


def test_bad_params_are_ignored_not_raised():
    d = SchedulerSide(engine_id="D", host="h", port=8, groups=GROUPS)
    assert d.get_num_new_matched_tokens(request(11, {"do_remote_prefill": True}), 0) == (0, False)


class FakeInbox:
    def __init__(self):
        self.queue, self.waits = [], []

    def drain(self, wait_s=0.0):
        self.waits.append(wait_s)
        out, self.queue = self.queue, []
        return out


def early(key: str = "k1", **over) -> dict:
    return {AWAIT_PREFILL: key, AWAIT_S: 30, **over}


def test_an_early_decode_waits_unscheduled_until_its_params_come_then_loads():
    store, inbox, now = FakeStore(), FakeInbox(), [0.0]
    d = SchedulerSide(engine_id="D", host="h", port=8, groups=GROUPS, checkpoints=store, inbox=inbox,
                      clock=lambda: now[0])
    req = request(11, early())
    assert d.get_num_new_matched_tokens(req, 4) == (None, False)
    d.build_meta(scheduled_tokens=0)
    assert inbox.waits[-1] > 0  # nothing to compute: the step waits on the inbox
    inbox.queue.append(PrefillOutcome("k1", remote_params()))
    assert d.get_num_new_matched_tokens(req, 4) == (6, True)
    assert AWAIT_PREFILL not in req.kv_transfer_params and req.kv_transfer_params["remote_engine_id"] == "P"
    assert d.get_num_new_matched_tokens(req, 4) == (6, True)  # asked again: the same answer
    d.update_state_after_alloc(req, ([9, 0, 12], [20, 21, 22]), num_external_tokens=6)
    (job,) = d.build_meta().loads
    assert job.plan.runs == (Run(0, 101, 50), Run(0, 12, 3), Run(1, 21, 6, 2))


def test_an_early_decode_whose_prefill_failed_or_never_answered_computes_the_prompt():
    inbox, now = FakeInbox(), [0.0]
    d = SchedulerSide(engine_id="D", host="h", port=8, groups=GROUPS, inbox=inbox, await_timeout_s=50,
                      clock=lambda: now[0])
    failed, silent = request(11, early("k1"), "r1"), request(11, early("k2", **{AWAIT_S: 5}), "r2")
    assert d.get_num_new_matched_tokens(failed, 0) == (None, False)
    assert d.get_num_new_matched_tokens(silent, 0) == (None, False)
    inbox.queue.append(PrefillOutcome("k1", None, "prefill_5xx"))
    assert d.get_num_new_matched_tokens(failed, 0) == (0, False)
    now[0] = 4.9
    assert d.get_num_new_matched_tokens(silent, 0) == (None, False)
    now[0] = 5.0  # the proxy's bound (5 s), under the decoder's own (50 s)
    assert d.get_num_new_matched_tokens(silent, 0) == (0, False)
    d.update_state_after_alloc(failed, ([1, 0, 2], [3, 4, 5]), num_external_tokens=0)
    meta = d.build_meta(scheduled_tokens=11)
    assert meta.loads == [] and meta.failed_waits == ["r1", "r2"] and inbox.waits[-1] == 0
    # P's params, late for the request that gave up: P is told to free them
    inbox.queue.append(PrefillOutcome("k2", remote_params(remote_request_id="p-late")))
    (job,) = d.build_meta(scheduled_tokens=1).loads
    assert job.plan is None and job.remote.remote_request_id == "p-late"


def test_an_early_decode_aborted_while_it_waits_frees_p_when_p_answers():
    inbox = FakeInbox()
    d = SchedulerSide(engine_id="D", host="h", port=8, groups=GROUPS, inbox=inbox)
    req = request(11, early())
    assert d.get_num_new_matched_tokens(req, 0) == (None, False)
    assert d.request_finished(req, ([], []), finished_ok=False) == (False, None)
    assert d.build_meta().loads == []
    inbox.queue.append(PrefillOutcome("k1", remote_params()))
    (job,) = d.build_meta().loads
    assert job.plan is None and job.reason


def test_a_decoder_without_an_inbox_computes_early_requests_at_once():
    d = SchedulerSide(engine_id="D", host="h", port=8, groups=GROUPS)
    req = request(11, early())
    assert d.get_num_new_matched_tokens(req, 0) == (0, False)
    assert d.build_meta().failed_waits == ["r1"]


def test_a_prefiller_keeps_its_own_state_where_its_prompt_ends_on_a_boundary():
    """P's own state block where it stopped, on a boundary, goes into its prefix cache (the store's keep): the
    Mamba group's block at that slot, never an attention block; a prompt end between boundaries keeps nothing."""
    store = FakeStore()
    p = SchedulerSide(engine_id="P", host="h", port=7, groups=GROUPS, checkpoints=store)
    req = request(11, {"do_remote_decode": True})
    truncate_prompt(req, p.on_new_request(req))
    req.num_computed_tokens = 8
    p.request_finished(req, ([0, 3], [5, 6]), finished_ok=True)
    assert store.kept == [(0, 3, 8)]
    at_n_minus_1 = SchedulerSide(engine_id="P", host="h", port=7, groups=GROUPS, checkpoints=store,
                                 prefill_to_boundary=False)
    for n, kept in ((11, []), (13, [(0, 9, 12)])):  # N-1 = 10: between boundaries; 12: on one
        store.kept = []
        req = request(n, {"do_remote_decode": True}, req_id=f"n{n}")
        truncate_prompt(req, at_n_minus_1.on_new_request(req))
        req.num_computed_tokens = n - 1
        at_n_minus_1.request_finished(req, ([0, 3, 9], [5, 6, 7]), finished_ok=True)
        assert store.kept == kept, n


def test_a_prefiller_counts_the_steps_it_took_and_says_so():
    """P's kv_transfer_params carry the engine steps in which vLLM scheduled the prompt P cut (build_meta's view of
    each step): the proxy's prefill fit learns from them rather than from its model of vLLM's splits."""
    p = SchedulerSide(engine_id="P", host="h", port=7, groups=GROUPS)
    req = request(11, {"do_remote_decode": True})
    truncate_prompt(req, p.on_new_request(req))
    for n in (4, 4):  # vLLM scheduled the 8 tokens in two steps
        p.build_meta(n, {"r1": n, "other": 1})
    req.num_computed_tokens = 8
    assert p.request_finished(req, ([0, 3], [5, 6]), finished_ok=True)[1]["prefill_steps"] == 2
    assert p.request_finished(req, ([0, 3], [5, 6]), finished_ok=True)[1]["prefill_steps"] == 0  # counted once
