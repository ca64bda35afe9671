"""Scheduler and worker halves without vLLM: fake requests, the in-memory transport, a fake clock."""

import itertools
from types import SimpleNamespace

import numpy as np

from hybrid_pd.connector.contract import PREFILL_STOP, STOP_BOUNDARY, STOP_LAST
from hybrid_pd.connector.errors import HandshakeError, HandshakeTimeout, PeerGone
from hybrid_pd.connector.messages import (
    PROTOCOL_VERSION,
    Done,
    Handshake,
    Region,
    Rejected,
    decode_notification,
    encode,
)
from hybrid_pd.connector.plan import GroupSpec, Run
from hybrid_pd.connector.scheduler_side import SchedulerSide
from hybrid_pd.connector.step import StepMeta
from hybrid_pd.connector.transport import InMemoryTransport
from hybrid_pd.connector.vllm_request import truncate_prompt
from hybrid_pd.connector.worker_side import WorkerSide

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
        self.pinned, self.released, self.registered, self.next = [], [], [], 100

    def pin(self, request, group, tokens):
        self.pinned.append((group, tokens))
        return 50, tokens

    def reserve(self, group):
        self.next += 1
        return self.next

    def register(self, request, group, block_id, tokens):
        self.registered.append((group, block_id, tokens))

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


# ---- worker half ----------------------------------------------------------------------------------------
class Clock:
    now = 0.0

    def __call__(self):
        return self.now


def worker(buf: np.ndarray, engine: str, clock, **kw) -> tuple[WorkerSide, InMemoryTransport]:
    t = InMemoryTransport(f"{engine}-{next(_names)}")
    base = buf.ctypes.data
    regions = [Region("m", 0, base, PAGE, STATE, NBLOCKS), Region("a", 1, base + NBLOCKS * PAGE, PAGE, PAGE, NBLOCKS)]
    hs = Handshake(PROTOCOL_VERSION, engine, 0, t.name, t.metadata(), ["mamba", "attention"], [4, 4], regions)
    return WorkerSide(t, hs, clock=clock, **kw), t


def pair(**kw):
    clock = Clock()
    src, dst = np.arange(2 * NBLOCKS * PAGE, dtype=np.uint32).astype(np.uint8), np.zeros(2 * NBLOCKS * PAGE, np.uint8)
    p, pt = worker(src, "P", clock)
    fetch = kw.pop("fetch", None) or (lambda host, port, timeout: encode(p.local))
    d, dt = worker(dst, "D", clock, fetch=fetch, **kw)
    return clock, src, dst, p, pt, d, dt


PLAN_RUNS = (Run(1, 2, 5, 2), Run(0, 7, 3))


def load_job(d_req="r1", plan_runs=PLAN_RUNS, handshakes=()):
    from hybrid_pd.connector.messages import RemotePrefill
    from hybrid_pd.connector.plan import TransferPlan
    from hybrid_pd.connector.worker_side import LoadJob

    rp = RemotePrefill("P", "p-" + d_req, "h", 7, [[0]], 8, 9, handshakes=list(handshakes))
    return LoadJob(d_req, rp, TransferPlan(tuple(plan_runs), 8))


def drive(w: WorkerSide, rounds=50):
    import time

    out = None
    for _ in range(rounds):
        out = w.poll()
        if out.finished_recving or out.finished_sending:
            return out
        time.sleep(0.01)
    return out


def test_load_reads_the_plan_notifies_and_the_prefiller_frees():
    clock, src, dst, p, pt, d, dt = pair()
    p.start(StepMeta(leases={"p-r1": 30}))
    d.start(StepMeta(loads=[load_job()]))
    res = drive(d)
    assert res.finished_recving == {"r1"} and not res.failed_recving
    a = NBLOCKS * PAGE
    assert (dst[a + 2 * PAGE:a + 4 * PAGE] == src[a + 5 * PAGE:a + 7 * PAGE]).all()
    assert (dst[7 * PAGE:7 * PAGE + STATE] == src[3 * PAGE:3 * PAGE + STATE]).all()
    assert len(dt.reads[0]) == 2  # 2 adjacent attention blocks: one descriptor; one state
    assert d.stats[0].bytes == 2 * PAGE + STATE and d.stats[0].descriptors == 2
    assert p.poll().finished_sending == {"p-r1"}


def test_reads_to_a_known_peer_are_posted_when_the_step_starts():
    """The first load waits for its handshake (posted by poll); later ones are posted by start(), so the READ
    runs during the step's forward pass and lands by the step's poll, as upstream's does."""
    clock, src, dst, p, pt, d, dt = pair()
    p.start(StepMeta(leases={"p-r1": 30, "p-r2": 30}))
    d.start(StepMeta(loads=[load_job("r1")]))
    assert drive(d).finished_recving == {"r1"} and len(dt.reads) == 1
    d.start(StepMeta(loads=[load_job("r2")]))
    assert len(dt.reads) == 2  # posted before any poll
    assert d.poll().finished_recving == {"r2"}


def test_failed_read_is_reported_failed_and_the_peer_is_re_handshaken():
    cleared = []
    clock, src, dst, p, pt, d, dt = pair(clear_blocks=cleared.extend)
    dt.fail_reads = True
    d.start(StepMeta(loads=[load_job()]))
    res = drive(d)
    assert res.finished_recving == {"r1"} == res.failed_recving and d.stats[-1].failed
    assert decode_notification(pt.notifications()[0]) == Rejected("p-r1", reason=f"READ from {pt.name} failed")
    assert d._peers == {}  # forgotten: the next request handshakes again
    assert cleared == [Run(1, 2, 5, 2), Run(0, 7, 3)]  # the blocks it may have half-written are zeroed


def test_stalled_read_fails_at_its_deadline():
    clock, src, dst, p, pt, d, dt = pair(read_timeout_s=5)
    dt.stall_reads = True
    d.start(StepMeta(loads=[load_job()]))
    assert not drive(d, rounds=5).finished_recving
    clock.now = 6
    res = d.poll()
    assert res.failed_recving == {"r1"}


def test_dead_side_channel_fails_the_request_not_the_engine():
    def fetch(host, port, timeout):
        raise HandshakeError("no answer")

    clock, src, dst, p, pt, d, dt = pair(fetch=fetch)
    d.start(StepMeta(loads=[load_job()]))
    assert drive(d).failed_recving == {"r1"}


def test_a_silent_side_channel_is_asked_again_until_the_read_deadline():
    """A starved prefiller answers late, not never: D asks again (each try its handshake timeout) and the load
    succeeds; one that stays silent fails at the READ deadline; one that is down fails at the first try."""
    tries = []

    def fetch(host, port, timeout):
        tries.append(timeout)
        clock.now += timeout  # each silent try costs its whole timeout
        if len(tries) < 3:
            raise HandshakeTimeout("no handshake within 5 s")
        return encode(p.local)

    clock, src, dst, p, pt, d, dt = pair(fetch=fetch, read_timeout_s=30, handshake_timeout_s=5)
    d.start(StepMeta(loads=[load_job()]))
    res = drive(d)
    assert res.finished_recving == {"r1"} and not res.failed_recving and len(tries) == 3
    a = NBLOCKS * PAGE
    assert (dst[a + 2 * PAGE:a + 4 * PAGE] == src[a + 5 * PAGE:a + 7 * PAGE]).all()

    def silent(host, port, timeout):
        tries.append(timeout)
        clock.now += timeout
        raise HandshakeTimeout("no handshake within 5 s")

    tries.clear()
    clock, src, dst, p, pt, d, dt = pair(fetch=silent, read_timeout_s=30, handshake_timeout_s=5)
    d.start(StepMeta(loads=[load_job()]))
    assert drive(d).failed_recving == {"r1"} and len(tries) == 6  # tries at 0, 5, ..., 25: the last ends at 30

    def down(host, port, timeout):
        tries.append(timeout)
        raise PeerGone("nothing listens there")

    tries.clear()
    clock, src, dst, p, pt, d, dt = pair(fetch=down, read_timeout_s=30, handshake_timeout_s=5)
    d.start(StepMeta(loads=[load_job()]))
    assert drive(d).failed_recving == {"r1"} and len(tries) == 1


def test_a_handshake_carried_in_the_params_needs_nothing_from_the_side_channel():
    """P puts its handshake into kv_transfer_params, so a prefiller whose side-channel thread gets no CPU still
    feeds D (on a shared core it did not answer for 25 s, every time:
    benchmarks/results/2026-11-24-cpu-burst/summary.md)."""
    asked = []

    def fetch(host, port, timeout):
        asked.append(port)
        raise HandshakeTimeout("no handshake within 5 s")

    clock, src, dst, p, pt, d, dt = pair(fetch=fetch)
    d.start(StepMeta(loads=[load_job(handshakes=[encode(p.local)])]))
    res = drive(d)
    assert res.finished_recving == {"r1"} and not res.failed_recving and asked == []
    a = NBLOCKS * PAGE
    assert (dst[a + 2 * PAGE:a + 4 * PAGE] == src[a + 5 * PAGE:a + 7 * PAGE]).all()
    d.start(StepMeta(loads=[load_job("r2")]))  # an older prefiller's params: D asks its side channel
    assert drive(d, rounds=3).failed_recving == set() and asked == []  # known peer: no new handshake


def test_an_idle_step_sleeps_while_its_reads_are_in_flight():
    """A step that computes nothing with READs in flight sleeps `idle_wait_s` instead of letting vLLM step again
    at once; a step with work, or one whose READ landed, does not."""
    slept: list[float] = []
    clock, src, dst, p, pt, d, dt = pair(idle_wait_s=0.002, sleep=slept.append)
    dt.stall_reads = True
    d.start(StepMeta(loads=[load_job()], idle=True))
    d.poll()
    d.poll()  # the flag is the step's: the next poll without a new idle step does not sleep
    d.start(StepMeta(idle=False))
    d.poll()
    assert slept == [0.002]
    dt.stall_reads = False
    d.start(StepMeta(idle=True))
    assert d.poll().finished_recving == {"r1"} and slept == [0.002]
    clock2, src2, dst2, p2, pt2, d2, dt2 = pair(sleep=slept.append)  # idle_wait_s 0 (GPU default): never
    dt2.stall_reads = True
    d2.start(StepMeta(loads=[load_job()], idle=True))
    d2.poll()
    assert slept == [0.002]


def test_lease_expiry_and_early_notifications_free_the_prefiller_blocks():
    clock, src, dst, p, pt, d, dt = pair()
    pt.inbox.append(encode(Done("early")))  # D's Done can beat the lease to P's worker
    assert p.poll().finished_sending == set()
    p.start(StepMeta(leases={"early": 30, "slow": 30}))
    assert p.poll().finished_sending == {"early"}
    clock.now = 31
    assert p.poll().finished_sending == {"slow"}
    pt.inbox.append(b"garbage")
    assert p.poll().finished_sending == set()
