"""The connector's worker half without vLLM (connector/worker_side.py): READs over the in-memory transport,
handshakes from the params or the side channel, deadlines, leases; a fake clock. The scheduler half is in
test_sides.py."""

import itertools

import numpy as np

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
from hybrid_pd.connector.plan import Run
from hybrid_pd.connector.step import StepMeta
from hybrid_pd.connector.transport import InMemoryTransport
from hybrid_pd.connector.worker_side import WorkerSide

PAGE, STATE, NBLOCKS = 64, 40, 16
_names = itertools.count()


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


def test_a_read_that_fails_as_a_step_starts_fails_in_that_steps_poll():
    """start() lands READs that completed since the last poll (their checks start ahead of the step's forward
    pass): one that failed does not raise there, the step's poll fails the load with its error."""
    cleared = []
    clock, src, dst, p, pt, d, dt = pair(clear_blocks=cleared.extend)
    p.start(StepMeta(leases={"p-r1": 30, "p-r2": 30}))
    d.start(StepMeta(loads=[load_job("r1")]))
    assert drive(d).finished_recving == {"r1"}
    dt.fail_reads = True
    d.start(StepMeta(loads=[load_job("r2")]))  # posted, and its failure met, here
    res = d.poll()
    assert res.failed_recving == {"r2"} == res.finished_recving and d.stats[-1].failed
    assert cleared == list(PLAN_RUNS)
    assert Rejected("p-r2", reason=f"READ from {pt.name} failed") in map(decode_notification, pt.notifications())


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
