"""benchmarks/trace_replay.py without engines: hash ids -> token ids, the generated shapes, the open loop's send
times and lateness, the closed loop's session order and think time."""

from __future__ import annotations

import threading

import pytest

from benchmarks.fleetsim_trace import TraceRequest
from benchmarks.trace_replay import SHAPES, closed_loop, due_times, open_loop, to_requests, trace_of
from benchmarks.workloads import Request, Tokens


@pytest.fixture(scope="module")
def tokens(tiny_model):
    return Tokens(tiny_model)


def common(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_requests_share_exactly_their_shared_hash_blocks(tokens):
    block = 64
    trace = [TraceRequest(0.0, 3 * 64 + 10, 5, [1, 2, 3, 4], "a", 0),
             TraceRequest(1.0, 4 * 64, 6, [1, 2, 3, 5], "a", 1),  # diverges at block 3
             TraceRequest(2.0, 2 * 64 + 1, 7, [1, 9, 10], "b", 0),  # at block 1
             TraceRequest(3.0, 3 * 64 + 40, 8, [1, 2, 3, 4]),  # block 3 longer than the first's partial one
             TraceRequest(4.0, 64 + 3, 9, [1 + 509 * 8, 11])]  # id 1's first digit, then another
    reqs = to_requests(trace, tokens, block)
    assert [len(r.token_ids) for r in reqs] == [t.input_length for t in trace]
    assert common(reqs[0].token_ids, reqs[1].token_ids) == 3 * 64
    assert common(reqs[0].token_ids, reqs[2].token_ids) == 64
    assert common(reqs[1].token_ids, reqs[2].token_ids) == 64
    assert reqs[3].token_ids[: 3 * 64 + 10] == reqs[0].token_ids  # one id, one block: a partial one is its prefix
    assert common(reqs[0].token_ids, reqs[4].token_ids) == 1  # ids 1 and 1 + 509 * 8 differ in their 2nd digit
    assert [(r.session, r.turn, r.max_tokens, r.at_s) for r in reqs] == [
        ("a", 0, 5, 0.0), ("a", 1, 6, 0.001), ("b", 0, 7, 0.002), ("req3", 0, 8, 0.003), ("req4", 0, 9, 0.004)]
    assert to_requests(trace, tokens, block) == reqs  # deterministic
    one, two = reqs[0].token_ids[:64], reqs[0].token_ids[64:128]  # ids 1 and 2: draws of their own seeds
    assert sum(a == b for a, b in zip(one, two)) < 8 + 8
    other = to_requests(trace, tokens, block, salt=1)  # the same sharing among themselves, none with salt 0's
    assert [len(r.token_ids) for r in other] == [len(r.token_ids) for r in reqs]
    assert common(other[0].token_ids, other[1].token_ids) == 3 * 64
    assert max(common(a.token_ids, b.token_ids) for a in reqs for b in other) == 0
    special = set(tokens.tok.all_special_ids)
    assert not special & {t for r in reqs for t in r.token_ids}


def test_a_trace_whose_lengths_do_not_fit_its_blocks_is_refused(tokens):
    with pytest.raises(ValueError, match="input_length 129"):
        to_requests([TraceRequest(0.0, 129, 1, [1, 2])], tokens, 64)
    with pytest.raises(ValueError, match="input_length 64"):
        to_requests([TraceRequest(0.0, 64, 1, [1, 2])], tokens, 64)


def reuse(trace: list[TraceRequest]) -> float:
    """The share of input blocks whose hash id an earlier request had."""
    seen, hit, total = set(), 0, 0
    for r in trace:
        hit += sum(h in seen for h in r.hash_ids)
        total += len(r.hash_ids)
        seen.update(r.hash_ids)
    return hit / total


@pytest.mark.parametrize(("shape", "mean_in", "reused", "out"), [
    ("agentic-8k", (7000, 9500), (0.55, 0.8), (64, 64)),
    ("agentic-64k-half", (24000, 34000), (0.85, 0.95), (300, 500)),
    ("cpu-tiny", (500, 1800), (0.3, 0.9), (16, 16)),
])
def test_generated_shapes_have_their_stated_lengths_and_reuse(shape, mean_in, reused, out):
    trace = trace_of(shape, 512)
    mean = sum(r.input_length for r in trace) / len(trace)
    assert mean_in[0] < mean < mean_in[1], mean
    assert reused[0] < reuse(trace) < reused[1], reuse(trace)
    assert all(out[0] <= r.output_length <= out[1] for r in trace)
    assert max(r.input_length + r.output_length for r in trace) <= (2048 if shape == "cpu-tiny" else 40960)
    assert len({r.session_id for r in trace}) == SHAPES[shape].sessions


def reqs_at(*at: float) -> list[Request]:
    return [Request("trace", f"s{i}", 0, (1,), at_s=a) for i, a in enumerate(at)]


def test_due_times_scale_the_trace_to_the_rate():
    assert due_times(reqs_at(10.0, 11.0, 13.0, 14.0), rate=3.0) == pytest.approx([0.0, 0.25, 0.75, 1.0])
    flat = due_times(reqs_at(*[0.0] * 2000), rate=4.0, seed=5)  # no spacing in the trace: Poisson at the rate
    assert flat[0] == 0.0 and flat == sorted(flat)
    assert 1999 / flat[-1] == pytest.approx(4.0, rel=0.1)
    assert due_times(reqs_at(*[0.0] * 5), 2.0, seed=1) == due_times(reqs_at(*[0.0] * 5), 2.0, seed=1)


class FakeClock:
    """Time that moves only when slept (each sleep overshoots by `oversleep`) or when a start takes time."""

    def __init__(self, oversleep: float = 0.0):
        self.now, self.oversleep, self.slept = 100.0, oversleep, []

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s + self.oversleep


def test_open_loop_sends_when_due_and_records_lateness():
    fake, started = FakeClock(oversleep=0.002), []
    late = open_loop([0.0, 0.5, 0.5, 2.0], lambda i: started.append((i, fake.now - 100.0)), fake.clock, fake.sleep)
    assert [i for i, _ in started] == [0, 1, 2, 3]
    assert [t for _, t in started] == pytest.approx([0.0, 0.502, 0.502, 2.002])
    assert late == pytest.approx([0.0, 0.002, 0.002, 0.002])
    assert fake.slept == pytest.approx([0.5, 1.498])


def test_open_loop_does_not_wait_for_slow_starts_and_reports_them_late():
    fake = FakeClock()

    def slow_start(i: int) -> None:
        fake.now += 0.3  # handing a request over took 0.3 s

    late = open_loop([0.0, 0.1, 0.2, 1.0], slow_start, fake.clock, fake.sleep)
    assert late == pytest.approx([0.0, 0.2, 0.4, 0.0])
    assert fake.slept == pytest.approx([0.1])


def test_closed_loop_keeps_turn_order_concurrency_and_think_time():
    reqs = [Request("trace", s, t, (1,), think_s=0.25 * t) for t in range(3) for s in ("a", "b", "c")]
    busy, peak, order, slept, lock = [0], [0], [], [], threading.Lock()
    gate = threading.Barrier(2, timeout=5)

    def send(req: Request) -> dict:
        with lock:
            busy[0] += 1
            peak[0] = max(peak[0], busy[0])
            order.append((req.session, req.turn))
        if req.session in "ab" and req.turn == 0:
            gate.wait()  # both threads are in flight at once
        with lock:
            busy[0] -= 1
        return {"session": req.session, "turn": req.turn}

    rows = closed_loop(reqs, 2, send, sleep=slept.append)
    assert peak[0] == 2
    assert sorted((r["session"], r["turn"]) for r in rows) == sorted((r.session, r.turn) for r in reqs)
    for s in "abc":
        assert [t for x, t in order if x == s] == [0, 1, 2]
    assert sorted(slept) == [0.25] * 3 + [0.5] * 3  # before turns 1 and 2, never before a first turn
