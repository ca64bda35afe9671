"""The placement model (proxy/placement/cost_model.py): its choice is monotone in load and in hits, it never picks a
worker that cannot serve, and its predictions on the GPU shapes its priors came from read as those runs did."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from hybrid_pd.proxy.placement.cost_model import (
    BOUNDARY,
    LAST,
    PRIORS,
    Rates,
    WorkerView,
    local_steps,
    place,
    queue_ms,
    remote_tail,
)

PROPS = settings(max_examples=300, deadline=None)


@st.composite
def rates(draw: st.DrawFn) -> Rates:
    ms = st.floats(0, 200, allow_nan=False, allow_infinity=False)
    small = st.floats(0, 0.05, allow_nan=False, allow_infinity=False)
    kv_mb, read = draw(st.floats(0, 0.01)), draw(st.floats(0, 0.5))
    # a prefill costs at least what reading its KV costs (the model's premise: cost_model.py)
    per_token = draw(st.floats(kv_mb * read, kv_mb * read + 0.05))
    return Rates(
        prefill_step_ms=draw(ms),
        prefill_ms_per_token=per_token,
        prefill_ms_per_token_per_kctx=draw(small),
        hop_ms=draw(ms),
        read_ms_per_mb=read,
        kv_mb_per_token=kv_mb,
        checkpoint_mb=draw(st.floats(0, 100)),
        step_ms=draw(st.floats(0, 50)),
        step_ms_per_seq=draw(st.floats(0, 5)),
        chunk_tokens=draw(st.sampled_from([256, 2048, 8192, 1 << 20])),
        prefiller_call_factor=draw(st.sampled_from([1.0, 0.0]) | st.floats(0.25, 8)),  # learned online
        next_remote=draw(st.sampled_from([0.0, 1.0]) | st.floats(0, 1)),  # learned online
        align_split=draw(st.booleans()),
    )


@st.composite
def scenario(draw: st.DrawFn) -> dict:
    n = draw(st.integers(1, 200_000))
    hits = st.integers(0, n)
    decoder = WorkerView("d", draw(hits), draw(st.floats(0, 256)), draw(st.integers(0, 100_000)))
    prefillers = [
        WorkerView(f"p{i}", draw(hits), draw(st.floats(0, 64)), draw(st.integers(0, 100_000)), draw(st.booleans()))
        for i in range(draw(st.integers(0, 4)))
    ]
    return {
        "prompt_tokens": n,
        "decoder": decoder,
        "prefillers": prefillers,
        "rates": draw(rates()),
        "itl_slo_ms": draw(st.sampled_from([0.0, 5.0, 20.0, 50.0, 200.0])),
        "aligned_block": draw(st.sampled_from([0, 16, 544, 1040])),
        "shared_device": draw(st.sampled_from([0.0, 0.5, 1.0])),  # the share of P's prefill D's streams wait for
    }


def choose(s: dict, **changes) -> str | None:
    s = {**s, **changes}
    return place(s["prompt_tokens"], s["decoder"], s["prefillers"], s["rates"], itl_slo_ms=s["itl_slo_ms"],
                 aligned_block=s["aligned_block"], shared_device=s["shared_device"]).prefiller


@PROPS
@given(scenario())
def test_never_picks_a_worker_that_cannot_serve(s):
    p = place(s["prompt_tokens"], s["decoder"], s["prefillers"], s["rates"], itl_slo_ms=s["itl_slo_ms"],
              aligned_block=s["aligned_block"], shared_device=s["shared_device"])
    serving = {w.name for w in s["prefillers"] if w.can_serve}
    assert p.prefiller is None or p.prefiller in serving
    assert {o.prefiller for o in p.options} == {None} | serving
    assert p.chosen in p.options and p.chosen.prefiller == p.prefiller
    if not serving:
        assert p.local and p.reason == "local_only"


@PROPS
@given(scenario(), st.floats(0, 512))
def test_a_busier_decoder_never_moves_a_turn_from_a_prefiller_to_it(s, more):
    """Not on a shared device: there a prefill on P stalls D's streams too, and more of them can favour the option
    that computes less (test_on_a_shared_device_a_prefiller_holding_less_stalls_the_decoder_more)."""
    if choose(s) is not None and not s["shared_device"]:
        busier = dataclasses.replace(s["decoder"], load=s["decoder"].load + more)
        assert choose(s, decoder=busier) is not None


@PROPS
@given(scenario(), st.integers(0, 200_000))
def test_a_longer_queue_on_the_decoder_never_moves_a_turn_from_a_prefiller_to_it(s, more):
    if choose(s) is not None:
        busier = dataclasses.replace(s["decoder"], queued_tokens=s["decoder"].queued_tokens + more)
        assert choose(s, decoder=busier) is not None


@PROPS
@given(scenario(), st.floats(0, 64), st.integers(0, 200_000))
def test_busier_prefillers_never_move_a_turn_from_the_decoder_to_them(s, more, tokens):
    if choose(s) is None:
        busier = [dataclasses.replace(p, load=p.load + more, queued_tokens=p.queued_tokens + tokens)
                  for p in s["prefillers"]]
        assert choose(s, prefillers=busier) is None


# Found by Hypothesis: no option within the SLO at hit 1040, both D alone and P stopping at the boundary (the
# same tail on D, so the same gap) within it at 1041; equal gaps went to the faster TTFT, the SLO's objective adds
# the next turn's term, and the turn moved to P.
SAME_GAP = {
    "prompt_tokens": 1983,
    "decoder": WorkerView("d", hit=1040, load=18.0, queued_tokens=0, can_serve=True),
    "prefillers": [WorkerView("p0", hit=0, load=0.0, queued_tokens=0, can_serve=True)],
    "rates": Rates(prefill_step_ms=44.0, prefill_ms_per_token=0.046875, prefill_ms_per_token_per_kctx=0.046875,
                   hop_ms=0.0, read_ms_per_mb=0.0, kv_mb_per_token=0.0, checkpoint_mb=0.0, step_ms=9.0,
                   step_ms_per_seq=2.0, chunk_tokens=2048, prefiller_call_factor=1.0, next_remote=1.0),
    "itl_slo_ms": 200.0,
    "aligned_block": 1040,
    "shared_device": True,
}


@PROPS
@given(scenario(), st.integers(0, 200_000))
@example(SAME_GAP, 1)
def test_a_larger_hit_on_the_decoder_never_moves_a_turn_from_it(s, more):
    if choose(s) is None:
        warmer = dataclasses.replace(s["decoder"], hit=s["decoder"].hit + more)
        assert choose(s, decoder=warmer) is None


@PROPS
@given(scenario(), st.integers(0, 200_000))
def test_larger_hits_on_prefillers_never_move_a_turn_from_them_to_the_decoder(s, more):
    """Without the next-turn term (q = 0): with it, a warmer P also shrinks what D alone leaves the next turn,
    and where D's queue bounds the remote option's TTFT that alone may move the turn to D (cost_model.py)."""
    s = {**s, "rates": dataclasses.replace(s["rates"], next_remote=0.0)}
    if choose(s) is not None:
        warmer = [dataclasses.replace(p, hit=p.hit + more) for p in s["prefillers"]]
        assert choose(s, prefillers=warmer) is not None


@PROPS
@given(scenario(), st.integers(0, 200_000), st.floats(0, 256))
def test_predictions_move_with_hits_and_load(s, more_hit, more_load):
    def local(d: WorkerView):
        return place(s["prompt_tokens"], d, [], s["rates"], aligned_block=s["aligned_block"]).chosen

    d = s["decoder"]
    base = local(d)
    assert local(dataclasses.replace(d, hit=d.hit + more_hit)).ttft_ms <= base.ttft_ms + 1e-9
    assert local(dataclasses.replace(d, load=d.load + more_load)).ttft_ms >= base.ttft_ms - 1e-9
    assert base.ttft_ms >= 0 and base.stall_ms >= 0 and base.gap_ms >= 0


@PROPS
@given(scenario())
def test_within_the_itl_objective_when_any_option_is(s):
    if s["itl_slo_ms"] <= 0:
        return
    p = place(s["prompt_tokens"], s["decoder"], s["prefillers"], s["rates"], itl_slo_ms=s["itl_slo_ms"],
              aligned_block=s["aligned_block"], shared_device=s["shared_device"])
    within = [o for o in p.options if o.meets_itl]
    if within:
        assert p.chosen.meets_itl
        assert p.chosen.ttft_ms + p.chosen.next_turn_ms == min(o.ttft_ms + o.next_turn_ms for o in within)
    else:
        assert p.chosen.gap_ms == min(o.gap_ms for o in p.options)


def test_a_decoder_that_cannot_serve_is_refused():
    with pytest.raises(ValueError):
        place(100, WorkerView("d", can_serve=False), [WorkerView("p")])


def test_steps_and_tail_follow_align_mode():
    # 2026-11-25-h100-prefill-steps: 4,857 tokens = 4,352 + 505; cut at a boundary, 4,352 = 3,808 + 544 on vLLM 0.32+
    # (a state cached only below a prompt's last token; the CPU bed's P: two steps a turn, test_prefiller_hits.py)
    assert local_steps(4857, 0, 544, 8192) == 2
    assert local_steps(4352, 0, 544, 8192) == 2
    assert local_steps(4352, 3808, 544, 8192) == 1  # its last block alone
    assert local_steps(9181, 8704, 544, 8192) == 1  # the tail alone
    assert local_steps(9181, 0, 0, 8192) == 2  # attention-only: chunks only
    assert remote_tail(9181, 544) == 9181 - 8704
    assert remote_tail(8704, 544) == 544  # P stops below the prompt's end: one block short when aligned
    assert remote_tail(9181, 0) == 1
    assert remote_tail(9181, 544, LAST) == 1
    assert remote_tail(500, 544) == 1  # no boundary below the end: N-1, as the connector does
    assert local_steps(9181, 8704, 544, 256) == 2  # a tail longer than a chunk takes two


def test_p_stopping_at_the_boundary_prices_the_step_its_engine_ends_a_block_below():
    """Where the engine splits, P's prompt cut at the boundary takes two steps, as P's N-1 does: neither stop
    is a step cheaper on P (the boundary's cost is D's tail step)."""
    p = place(4857, WorkerView("d"), [WorkerView("p")], PRIORS, aligned_block=544)
    _, boundary, last = p.options
    assert boundary.prefiller_ms == pytest.approx(PRIORS.prefill_ms(4352, 0, 2))  # 3,808 + 544
    assert last.prefiller_ms == pytest.approx(PRIORS.prefill_ms(4856, 0, 2))  # 4,352 + 504


def test_the_tail_after_the_boundary_is_a_step_on_the_decoder():
    """2026-11-26 H200 run: D's step with a tail of a few hundred tokens took 37 ms where a decode step took 6.6:
    the option prices it as a prefill step, which each of D's streams waits for; N-1 leaves D one token."""
    p = place(6615, WorkerView("d", 3808, load=7), [WorkerView("p", 4352)], PRIORS, aligned_block=544)
    local, boundary, last = p.options
    assert (boundary.stop, last.stop) == (BOUNDARY, LAST)
    assert boundary.decoder_tokens == 87 and last.decoder_tokens == 1
    assert boundary.stall_ms >= PRIORS.prefill_step_ms and last.stall_ms < 0.1
    assert local.stall_ms > boundary.stall_ms  # two steps on D alone (to the boundary, then the rest)
    assert p.prefiller == "p" and p.stop == LAST  # 7 streams: none of them waits for a prefill step


def test_without_the_align_split_p_s_n_minus_1_is_a_step_cheaper_than_the_boundary():
    """vLLM 0.32+ writes the state at the last aligned boundary inside the prompt's last chunk (align_split off):
    P computing N-1 takes its chunks' steps, as P stopping at the boundary does, while the boundary leaves D the
    tail in a prefill step of its own. 2026-11-27-h100x4-qwen3next-c1-tax-vllm033 (same engines, every turn through
    P): TTFT p50 177 ms at N-1 against 267 at the boundary, D's part 10-12 ms against 56-77; ours with its own
    decider served all 10 turns on D alone (p50 157). Warm turn 1 of its probe: 6,951 tokens, 4,896 held by both."""
    rates = dataclasses.replace(PRIORS, align_split=False)
    assert local_steps(4857, 0, 544, 8192, split=False) == 1 and rates.steps(4857, 0, 544) == 1
    idle = place(6951, WorkerView("d", 4896), [WorkerView("p", 4896)], rates, aligned_block=544)
    local, boundary, last = idle.options
    assert idle.local  # D idle, holding the turn before: D alone, one step
    assert last.ttft_ms < boundary.ttft_ms - 0.5 * rates.prefill_step_ms  # the tail's step on D
    assert last.read_mb == pytest.approx(boundary.read_mb + (6950 - 6528) * rates.kv_mb_per_token + rates.checkpoint_mb)
    busy = place(6951, WorkerView("d", 4896, load=7), [WorkerView("p", 4896)], rates, aligned_block=544)
    assert busy.prefiller == "p" and busy.stop == LAST
    split = place(6951, WorkerView("d", 4896), [WorkerView("p", 4896)], PRIORS, aligned_block=544)
    # where the engine splits, P's boundary cut takes two steps as its N-1 does (vLLM 0.32+: a state is cached only
    # below a prompt's last token), so N-1 stays a step cheaper for D; on 0.26 the boundary was a step less on P
    assert PRIORS.align_split and split.options[2].ttft_ms < split.options[1].ttft_ms - 0.5 * PRIORS.prefill_step_ms


def test_the_checkpoint_below_n_minus_1_is_priced_whatever_the_decoder_holds():
    """P at N-1 ships the aligned checkpoint below its stop for D to keep. Priced only where D lacked it, a D hit
    one token longer (reaching that boundary) would make the remote option cheaper by a whole checkpoint's READ
    while D alone got one token cheaper: a larger hit on D could then move a turn from D to P."""
    options = [place(1089, WorkerView("d", hit), [WorkerView("p", 0)], PRIORS, aligned_block=544, stop=LAST).options[1]
               for hit in (1087, 1088)]
    assert options[0].read_mb - options[1].read_mb == pytest.approx(PRIORS.kv_mb_per_token)
    assert options[1].read_mb == pytest.approx(2 * PRIORS.checkpoint_mb)


def test_a_prefillers_queue_is_steps_of_batched_chunks():
    """An engine step batches several queued prompts' chunks: 8 queued prompts of 2,000 tokens are 2 steps of
    8,192, not 8; a worker running requests whose tokens this proxy does not know costs one step."""
    assert queue_ms(PRIORS, 16000, 8) == 2 * PRIORS.prefill_step_ms + 16000 * PRIORS.prefill_ms_per_token
    assert queue_ms(PRIORS, 0, 3) == PRIORS.prefill_step_ms
    assert queue_ms(PRIORS, 0, 0) == 0


def test_the_factor_on_p_s_call_scales_p_s_part_of_each_remote_option_and_nothing_else():
    """f (OnlineRates' fit of P's call under load) multiplies each remote option's queue + prefill on P, which the
    option keeps before f (prefiller_ms: what the fit compares P's measured call with); D alone, the hop, the READ
    and D's steps are as they were."""
    d, ps = WorkerView("d", 3808, load=7), [WorkerView("p", 2176, load=3, queued_tokens=6000)]
    base = place(9181, d, ps, PRIORS, aligned_block=544)
    loaded = place(9181, d, ps, dataclasses.replace(PRIORS, prefiller_call_factor=1.5), aligned_block=544)
    assert loaded.options[0] == base.options[0] and base.options[0].prefiller_ms == 0
    for b, o in zip(base.options[1:], loaded.options[1:]):
        assert o.prefiller_ms == b.prefiller_ms > queue_ms(PRIORS, 6000, 3)
        assert o.ttft_ms == pytest.approx(b.ttft_ms + 0.5 * b.prefiller_ms)
        assert (o.stall_ms, o.gap_ms, o.read_mb) == (b.stall_ms, b.gap_ms, b.read_mb)


def test_priors_read_as_the_gpu_runs_did():
    """r1-r4's warm turn 2 (9,181 tokens, 6,528 cached on both): one engine computed the tail in two steps
    (colocated TTFT 106-117 ms); the model puts D alone within the runs' spread of that."""
    p = place(9181, WorkerView("d", 6528), [WorkerView("p", 6528)], PRIORS, aligned_block=544)
    local = p.options[0]
    assert 90 <= local.ttft_ms <= 160
    # a decoder holding everything to the last boundary: D alone, one step, no hop
    p = place(9181, WorkerView("d", 8704), [WorkerView("p", 0)], PRIORS, aligned_block=544)
    assert p.local and p.chosen.decoder_tokens == 9181 - 8704
    # a cold prompt: P computes it (the same steps plus a hop, but D's 16 streams would each wait for it)
    busy = place(9181, WorkerView("d", 0, load=16), [WorkerView("p", 0)], PRIORS, aligned_block=544)
    assert not busy.local


def test_the_itl_objective_keeps_a_busy_decoders_streams_within_it():
    d, p = WorkerView("d", 6528, load=8), [WorkerView("p", 6528)]
    loose = place(9181, d, p, PRIORS, itl_slo_ms=500, aligned_block=544)
    tight = place(9181, d, p, PRIORS, itl_slo_ms=40, aligned_block=544)
    assert tight.prefiller == "p" and tight.chosen.gap_ms <= 40
    assert loose.options[0].meets_itl
    idle = place(9181, dataclasses.replace(d, load=0), p, PRIORS, itl_slo_ms=40, aligned_block=544)
    assert idle.options[0].meets_itl  # no stream to delay


@PROPS
@given(scenario())
def test_on_a_shared_device_a_prefiller_holding_less_stalls_the_decoder_more(s):
    """Shared device, prefillers holding no more than D: a remote option to the boundary computes at least D
    alone's tokens in at least its steps (P's part and D's tail), so each of D's streams waits at least as long
    for it as for D alone. (To N-1 the last token rides in D's decode step, priced without its context.)"""
    d = s["decoder"]
    ps = [dataclasses.replace(p, hit=min(p.hit, d.hit)) for p in s["prefillers"]]
    p = place(s["prompt_tokens"], d, ps, s["rates"], aligned_block=s["aligned_block"], shared_device=True)
    local = p.options[0]
    for o in p.options[1:]:
        if o.stop == BOUNDARY:
            assert o.stall_ms >= local.stall_ms * (1 - 1e-9) - 1e-9, (o, local)


def test_d_alone_leaves_the_next_turn_p_s_recompute_times_the_chance_it_goes_there():
    """A new 4,327-token conversation, nothing cached anywhere, D and P idle (request 17 of
    2026-11-26-h100x2-qwen3next-judged-vllm033 at c=8, served by D alone; the session's next turn went to P, which
    computed the 3,808 tokens again). D alone is the faster TTFT; with q = 1 its cost carries P's prefill of what
    it computed (the remote option's 3,808 tokens to the boundary), and the turn goes to P. The TTFTs do not move:
    the term is the next turn's."""
    d, ps = WorkerView("d", 0), [WorkerView("p", 0)]
    alone = place(4327, d, ps, PRIORS, aligned_block=544)
    rates = dataclasses.replace(PRIORS, next_remote=1.0)
    ahead = place(4327, d, ps, rates, aligned_block=544)
    assert alone.local and not ahead.local
    assert [o.ttft_ms for o in ahead.options] == [o.ttft_ms for o in alone.options]
    local = ahead.options[0]
    assert local.next_turn_ms == pytest.approx(PRIORS.prefill_ms(3808, 4327 - 3808))
    assert local.cost_ms == pytest.approx(alone.options[0].cost_ms + local.next_turn_ms)
    assert all(o.next_turn_ms == 0 for o in ahead.options[1:])
    half = place(4327, d, ps, dataclasses.replace(rates, next_remote=0.5, prefiller_call_factor=0.5), aligned_block=544)
    assert half.options[0].next_turn_ms == pytest.approx(0.25 * local.next_turn_ms)
    # with the ITL objective too: the least TTFT plus the next turn's term among the options within it
    assert not place(4327, d, ps, rates, itl_slo_ms=50, aligned_block=544).local


def test_a_remote_turn_waits_for_the_prompt_tokens_queued_on_d():
    """D's first step for a pulled turn waits for the prompt tokens queued on D ahead of it, where they outlast
    P's call, the hop and the READ; a short queue is done by then."""
    ps = [WorkerView("p", 0)]
    idle = place(4327, WorkerView("d", 0, load=1), ps, PRIORS, aligned_block=544)
    short = place(4327, WorkerView("d", 0, load=1, queued_tokens=1000), ps, PRIORS, aligned_block=544)
    long = place(4327, WorkerView("d", 0, load=1, queued_tokens=60_000), ps, PRIORS, aligned_block=544)
    for i, remote in enumerate(idle.options[1:], 1):
        assert short.options[i].ttft_ms == pytest.approx(remote.ttft_ms)
        queue = 60_000 * PRIORS.prefill_ms_per_token
        assert long.options[i].ttft_ms > remote.ttft_ms and long.options[i].ttft_ms >= queue


def test_a_remote_option_carries_the_delay_of_the_requests_behind_it_on_the_prefiller():
    """P's prefill delays each request that queues behind it on P (as many as it finds there), as D alone's stalls
    D's streams. Request 32 of 2026-11-26-h100x2-qwen3next-judged-vllm033-r2 (c=8): 6,731 tokens, 3,808 of them
    on D and on P, 3 streams on D (the turns it had just taken alone), P four requests and ~17k tokens deep
    (requests 25-28 under way), f 0.924: sent to P (measured TTFT 246 ms, where those three turns took 165-175);
    with P's queue counted, D alone."""
    rates = dataclasses.replace(PRIORS, prefiller_call_factor=0.924)
    d, p = WorkerView("d", 3808, load=3), WorkerView("p", 3808, queued_tokens=17000, load=4)
    counted = place(6731, d, [p], rates, aligned_block=544)
    ignored = place(6731, d, [p], rates, aligned_block=544, prefiller_queue=False)
    assert counted.local and not ignored.local
    for with_queue, without in zip(counted.options[1:], ignored.options[1:]):
        prefill = rates.prefill_ms(with_queue.prefill_tokens, 3808, 2)  # either stop: a step a block below it
        assert with_queue.behind_ms == pytest.approx(4 * 0.924 * prefill)
        assert with_queue.cost_ms == pytest.approx(without.cost_ms + with_queue.behind_ms)
        assert with_queue.ttft_ms == without.ttft_ms and without.behind_ms == 0
    assert counted.options[0] == ignored.options[0]  # D alone's figures do not move
    idle = place(6731, d, [dataclasses.replace(p, load=0, queued_tokens=0)], rates, aligned_block=544)
    assert all(o.behind_ms == 0 for o in idle.options)  # nobody behind it on an idle prefiller


def test_a_named_stop_leaves_only_its_remote_options():
    d = WorkerView("d", 0, 0)
    ps = [WorkerView("p", 0, 0)]
    both = {o.stop for o in place(4718, d, ps, PRIORS, aligned_block=544).options if o.prefiller}
    assert both == {BOUNDARY, LAST}
    for stop in (BOUNDARY, LAST):
        named = place(4718, d, ps, PRIORS, aligned_block=544, stop=stop)
        assert {o.stop for o in named.options if o.prefiller} == {stop}
    # no boundary below the end: N-1 is the only stop there is, whatever is named
    short = place(300, d, ps, PRIORS, aligned_block=544, stop=BOUNDARY)
    assert {o.stop for o in short.options if o.prefiller} == {LAST}
