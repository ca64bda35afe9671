"""KV integrity end to end without vLLM: P's scheduler asks its worker for digests in the step a prompt
completes, they join the kv_transfer_params, D checks the blocks it landed and fails a load that differs."""

import json
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hybrid_pd.connector import integrity
from hybrid_pd.connector.errors import BadTransferParams, DigestMismatch
from hybrid_pd.connector.kv_digest import ALGORITHM, PendingDigests, flip_first_word
from hybrid_pd.connector.messages import (
    PROTOCOL_VERSION,
    BlockDigests,
    GroupDigests,
    Handshake,
    Region,
    RemotePrefill,
    parse_remote_prefill,
)
from hybrid_pd.connector.plan import GroupSpec, Run, TransferPlan
from hybrid_pd.connector.scheduler_side import SchedulerSide
from hybrid_pd.connector.step import LoadJob, StepMeta
from hybrid_pd.connector.transport import InMemoryTransport
from hybrid_pd.connector.worker_side import WorkerSide

GROUPS = [GroupSpec("mamba", 4), GroupSpec("attention", 4)]
PAGE, STATE, NBLOCKS = 64, 40, 16
PLAN = TransferPlan((Run(1, 2, 5, 2), Run(0, 7, 3)), 8)


def test_targets_skip_placeholders_and_repeats():
    assert integrity.digest_targets([[0, 0, 3, 0], [5, 6, 6]]) == [[3], [5, 6]]


def test_all_blocks_or_a_sample_that_a_rerun_repeats():
    plan = TransferPlan((Run(1, 10, 20, 8), Run(0, 7, 3)), 8)
    everything = integrity.pairs_to_verify(plan, 1.0, "r")
    assert len(everything) == 9 and (0, 7, 3) in everything
    assert integrity.pairs_to_verify(plan, 0.0, "r") == []
    sample = integrity.pairs_to_verify(plan, 0.25, "r")
    assert len(sample) == 3 and set(sample) <= set(everything)
    assert sample == integrity.pairs_to_verify(plan, 0.25, "r")
    assert len(integrity.pairs_to_verify(plan, 0.01, "r")) == 1  # never none while on
    assert {tuple(integrity.pairs_to_verify(plan, 0.25, f"r{i}")) for i in range(20)} != {tuple(sample)}


def test_verify_names_the_blocks_that_differ_and_ignores_blocks_without_a_digest():
    expected = BlockDigests(ALGORITHM, [[GroupDigests([3], [111]), GroupDigests([5, 6], [222, 333])]])
    landed = {(0, 7): 111, (1, 2): 222, (1, 3): 999}
    digest = lambda items: integrity.Computed([[landed[(g, b)] for b in ids] for g, ids in items])  # noqa: E731
    pairs = [(1, 2, 5), (1, 3, 6), (0, 7, 3)]
    with pytest.raises(DigestMismatch, match=r"1 of 3 checked blocks differ.*\(1, 3, 6\)"):
        integrity.start_check(expected, ALGORITHM, 0, pairs, digest, "r1").finish()
    assert integrity.start_check(expected, ALGORITHM, 0, [(1, 2, 5), (0, 7, 3), (1, 9, 9)], digest, "r1").finish() == 2
    assert integrity.start_check(expected, ALGORITHM, 1, pairs, digest, "r1").finish() == 0  # none for rank 1
    with pytest.raises(DigestMismatch, match="other-v9"):
        integrity.start_check(BlockDigests("other-v9", expected.ranks), ALGORITHM, 0, pairs, digest, "r1")


def test_digests_of_another_protocol_version_are_refused():
    params = RemotePrefill("P", "p", "h", 7, [[0]], 8, 9, digests=BlockDigests(ALGORITHM, [])).to_params()
    assert parse_remote_prefill(params).digests == BlockDigests(ALGORITHM, [])
    params["digests"]["version"] = PROTOCOL_VERSION + 1
    with pytest.raises(BadTransferParams, match="KV digests of protocol version"):
        parse_remote_prefill(params)


def request(n_prompt: int, req_id: str = "r1") -> SimpleNamespace:
    tokens = list(range(n_prompt))
    return SimpleNamespace(request_id=req_id, kv_transfer_params={"do_remote_decode": True},
                           prompt_token_ids=tokens, _all_token_ids=list(tokens), num_prompt_tokens=n_prompt,
                           max_tokens=16, num_computed_tokens=0)


def test_the_prefiller_asks_for_digests_in_the_step_the_prompt_completes_and_ships_them():
    p = SchedulerSide(engine_id="P", host="h", port=7, groups=GROUPS, digests=True)
    req = request(13)
    assert p.on_new_request(req) == 12
    req.num_prompt_tokens = 12
    p.note_blocks("r1", ([0, 3], [5, 6]), replace=True)
    assert p.build_meta(8, {"r1": 8}).digests == {}  # a chunk: the prompt is not complete yet
    req.num_computed_tokens = 8
    p.note_blocks("r1", ([0], [9]), replace=False)
    assert p.build_meta(4, {"r1": 4}).digests == {"r1": [[3], [5, 6, 9]]}
    req.num_computed_tokens = 12
    _, params = p.request_finished(req, ([0, 0, 3], [5, 6, 9]), finished_ok=True)
    groups = [GroupDigests([3], [-7]), GroupDigests([5, 6, 9], [1, 2, 3])]
    p.on_digests({"r1": {0: groups}}, ALGORITHM)
    remote = parse_remote_prefill(json.loads(json.dumps(params)))  # through the HTTP response and back
    assert remote.digests == BlockDigests(ALGORITHM, [groups])
    off = SchedulerSide(engine_id="P", host="h", port=7, groups=GROUPS)
    req = request(13)
    off.on_new_request(req)
    off.note_blocks("r1", ([0, 3], [5, 6]), replace=True)
    assert off.build_meta(12, {"r1": 12}).digests == {}


def test_digests_that_come_with_a_later_output_are_not_attached():
    p = SchedulerSide(engine_id="P", host="h", port=7, groups=GROUPS, digests=True)
    req = request(9)
    p.on_new_request(req)
    req.num_computed_tokens = 8
    _, params = p.request_finished(req, ([3], [5, 6]), finished_ok=True)
    p.build_meta(1, {})  # the next step: the params already left with the request's output
    p.on_digests({"r1": {0: [GroupDigests([3], [1]), GroupDigests([5, 6], [2, 3])]}}, ALGORITHM)
    assert params["digests"] is None


class Late:
    """Digests still on their way for the first `looks` ready() calls, as a GPU's kernels queued behind a step's
    forward pass are: reading them before (result()) would be the engine waiting for them."""

    def __init__(self, inner: integrity.Pending, looks: int):
        self.inner, self.looks = inner, looks

    def ready(self) -> bool:
        self.looks -= 1
        return self.looks < 0

    def result(self) -> list[list[int]]:
        assert self.looks < 0, "digests read before they were back: the engine would have waited"
        return self.inner.result()


class Gpu:
    """A GPU's progress as an engine's steps see it: each step queues work at its start (start_load_kv, before the
    forward pass), the forward pass runs, then the step polls (get_transfer_results). Digests queued in one phase
    are back in a later one."""

    def __init__(self):
        self.phase = 0

    def step(self, d: WorkerSide, meta: StepMeta | None = None):
        self.phase += 1
        d.start(meta or StepMeta())
        self.phase += 1  # the forward pass
        return d.poll()


class Queued:
    """Digests queued on `gpu` now: back once it moved on (reading them before would be the engine waiting)."""

    def __init__(self, inner: integrity.Pending, gpu: Gpu):
        self.inner, self.gpu, self.at = inner, gpu, gpu.phase

    def ready(self) -> bool:
        return self.gpu.phase > self.at

    def result(self) -> list[list[int]]:
        assert self.ready(), "digests read before they were back: the engine would have waited"
        return self.inner.result()


class Gate:
    """Digests back once `open`, counting the looks (ready() calls) a poll takes."""

    def __init__(self, inner: integrity.Pending):
        self.inner, self.open, self.looks = inner, False, 0

    def ready(self) -> bool:
        self.looks += 1
        return self.open

    def result(self) -> list[list[int]]:
        assert self.open, "digests read before they were back: the engine would have waited"
        return self.inner.result()


def worker(buf: np.ndarray, engine: str, late: int = 0, gpu: Gpu | None = None, gate: list | None = None, **kw
           ) -> tuple[WorkerSide, list[torch.Tensor]]:
    t = InMemoryTransport(f"{engine}-digest")
    whole = torch.from_numpy(buf)
    layers = [whole.as_strided((NBLOCKS, STATE), (PAGE, 1)), whole[NBLOCKS * PAGE :].view(NBLOCKS, PAGE)]
    regions = [Region("m", 0, buf.ctypes.data, PAGE, STATE, NBLOCKS),
               Region("a", 1, buf.ctypes.data + NBLOCKS * PAGE, PAGE, PAGE, NBLOCKS)]
    hs = Handshake(PROTOCOL_VERSION, engine, 0, t.name, t.metadata(), ["mamba", "attention"], [4, 4], regions)
    def digest(items):  # with `late`, digests that take that many looks to come back; with `gpu`, queued on it;
        pending = PendingDigests([([layers[g]], ids) for g, ids in items])  # with `gate`, behind a Gate (listed)
        if gate is not None:
            gate.append(Gate(pending))
            return gate[-1]
        return Late(pending, late) if late else Queued(pending, gpu) if gpu else pending

    return WorkerSide(t, hs, digest=digest, algorithm=ALGORITHM, **kw), layers


def prefilled(corrupt_reads: int = 0, verify_fraction: float = 1.0, late: int = 0, gpu: Gpu | None = None, **kw
              ) -> tuple[WorkerSide, LoadJob, list, WorkerSide]:
    """D's worker, the load of what P's worker digested, the blocks D zeroes when a load fails, and P's worker
    (keep it: its memory is what D reads)."""
    src = np.random.default_rng(1).integers(0, 255, 2 * NBLOCKS * PAGE, dtype=np.uint8)
    dst = np.zeros_like(src)
    p, _ = worker(src, "P")
    cleared: list = []
    d, d_layers = worker(dst, "D", late=late, gpu=gpu, fetch=lambda host, port, timeout: b"",
                         verify_fraction=verify_fraction, corrupt_reads=corrupt_reads, clear_blocks=cleared.extend,
                         corrupt_blocks=lambda runs: [flip_first_word([d_layers[r.group]], r.local_start)
                                                      for r in runs], **kw)
    p.start(StepMeta(digests={"p-r1": [[3], [5, 6]]}))
    taken = p.take_digests()
    assert taken is not None and p.take_digests() is None  # once
    shipped = taken.result()["p-r1"]
    from hybrid_pd.connector.messages import encode

    remote = RemotePrefill("P", "p-r1", "h", 7, [[0, 3], [5, 6]], 8, 9, handshakes=[encode(p.local)],
                           digests=BlockDigests(ALGORITHM, [shipped]))
    return d, LoadJob("r1", remote, PLAN), cleared, p


def load(corrupt_reads: int, verify_fraction: float = 1.0, late: int = 0):
    d, job, cleared, _p = prefilled(corrupt_reads, verify_fraction, late)
    d.start(StepMeta(loads=[job]))
    deadline, polls = time.monotonic() + 10, 0  # polled as a step would, for a load whose READ runs off this thread
    while time.monotonic() < deadline:
        res, polls = d.poll(), polls + 1
        if res.finished_recving:
            return res, d.stats[0], cleared, polls
        time.sleep(0.001)
    raise AssertionError("the load never finished")


def test_landed_blocks_that_match_pass_and_are_counted():
    res, stats, cleared, _ = load(corrupt_reads=0)
    assert res.finished_recving == {"r1"} and not res.failed_recving
    assert stats.blocks_verified == 3 and not stats.digest_mismatch and not cleared


def test_a_landed_read_waits_in_its_own_polls_for_its_digests_never_in_one():
    """D's engine steps on while the landed blocks' digests are computed: the load is reported in a later poll,
    each poll returning at once (Late fails the test if anything read the digests before they were back)."""
    _, _, _, prompt = load(corrupt_reads=0)
    res, stats, cleared, later = load(corrupt_reads=0, late=3)
    assert res.finished_recving == {"r1"} and not res.failed_recving and stats.blocks_verified == 3
    assert later >= prompt + 3
    res, stats, cleared, _ = load(corrupt_reads=1, late=2)
    assert res.failed_recving == {"r1"} and stats.digest_mismatch and cleared == list(PLAN.runs)


def test_a_read_landed_between_steps_is_checked_ahead_of_the_next_forward_pass_and_reported_in_its_poll():
    """A READ that lands while no step runs: the next step starts its check before its forward pass, so the
    digests are back by that step's poll, which reports the load (checked in the poll, they would queue behind
    the forward pass and the load would be reported a step later). A flipped byte fails it in the same step."""
    for corrupt in (0, 1):
        gpu = Gpu()
        d, job, cleared, _p = prefilled(corrupt_reads=corrupt, gpu=gpu)
        d.transport.stall_reads = True  # in flight
        res, deadline = gpu.step(d, StepMeta(loads=[job])), time.monotonic() + 10
        while not d.transport.reads and time.monotonic() < deadline:  # posted once the handshake is in
            res = gpu.step(d)
            time.sleep(0.001)
        assert d.transport.reads and not res.finished_recving
        d.transport.stall_reads = False  # the READ lands between two steps
        res = gpu.step(d)
        assert res.finished_recving == {"r1"}
        assert (res.failed_recving == {"r1"} and cleared == list(PLAN.runs)) if corrupt else not res.failed_recving


def first_polls(d: WorkerSide, job: LoadJob) -> list:
    """Poll (after the step that registers `job`) until its READ is posted and one poll more: the results of
    the poll that landed it (the in-memory READ lands when first polled) and of the next."""
    d.start(StepMeta(loads=[job]))
    landing, deadline = d.poll(), time.monotonic() + 10
    while not d.transport.reads and time.monotonic() < deadline:  # posted once the handshake is in
        time.sleep(0.001)
        landing = d.poll()
    return [landing, d.poll()]


def test_the_poll_that_lands_a_read_waits_for_its_digests_up_to_check_wait_s_once():
    """D's poll waits (check_wait_s, a spin) for the digests of the READ it landed, which a GPU computes beside
    the step's forward pass: back within it, the load is reported by that poll (not waiting, a poll or more
    later: the test above); not back, the poll gives up on time, the next polls look once each without
    waiting, and the first to find them back reports the load."""
    d, job, _, _p = prefilled(late=3, check_wait_s=5.0)
    landing, _ = first_polls(d, job)
    assert landing.finished_recving == {"r1"} and not landing.failed_recving
    gates: list[Gate] = []
    d, job, _, _p = prefilled(gate=gates, check_wait_s=0.02)
    landing, after = first_polls(d, job)
    assert not landing.finished_recving and not after.finished_recving
    looks = gates[0].looks
    assert looks > 3  # the landing poll waited, looking again and again; the next looked once
    assert d.poll().finished_recving == set() and gates[0].looks == looks + 1  # one look a poll, no wait
    gates[0].open = True
    assert d.poll().finished_recving == {"r1"}


def test_a_byte_flipped_in_flight_fails_the_load_zeroes_its_blocks_and_is_counted():
    res, stats, cleared, _ = load(corrupt_reads=1)
    assert res.failed_recving == {"r1"} and res.finished_recving == {"r1"}
    assert stats.failed and stats.digest_mismatch and cleared == list(PLAN.runs)


def test_with_verification_off_a_flipped_byte_goes_through():
    res, stats, _, _ = load(corrupt_reads=1, verify_fraction=0.0)
    assert not res.failed_recving and stats.blocks_verified == 0
