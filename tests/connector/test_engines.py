"""Real engines with our connector, started by the launchers: PD equals one engine, moves minimal bytes,
ships Mamba checkpoints D can reuse, survives a dead prefiller, and leaks no blocks on P.

The engines come from the session's pool (tests/support/engines.py; REF, P and D are other modules' too): first
REF (`--connector none`) computes every reference output, then P_OTHER (other weights) + D, then P + D: D outlives
the killed P_OTHER and pairs with P, a new prefiller, without a restart; last, the negative controls of a turn D
serves alone (P + D, then P + a decoder that zeroes the states it reads).
"""

from __future__ import annotations

import json
import signal
import socket
import time

import psutil
import pytest

from hybrid_pd.connector.contract import PREFILL_STOP
from tests.support import controls
from tests.support.conversation import (ANSWER_TOKENS, assert_same_greedy, cached, colocated_pass, complete,
                                        decided_tokens, greedy_reference, logprob_delta, text_of, tokenize)
from tests.support.conversation import LOGPROB_FLOOR, PARITY, note_noise_floor, tolerance
from tests.support.engines import d_metrics, delta, pd_complete
from tests.support.procs import free_port
from tests.support.tiny_layout import BS, MAMBA_LAYERS, STATE, minimal_bytes

pytestmark = pytest.mark.engines

PD_PROMPTS = {n: f"{n}" for n in (20, 300, 700)}
HIT_PROMPT = text_of(600, 91_600)
HIT_PREFIX = " ".join(HIT_PROMPT.split()[:400])


def conversation(url: str, answer, turns: int, salt: int) -> list[tuple[list[int], dict]]:
    """Turn k+1 = turn k's prompt + its answer + new words, as token ids (text would re-tokenize across
    the seams and move block hashes); `answer(ids)` returns the response (with token ids)."""
    ids, out = tokenize(url, text_of(300, salt)), []
    for k in range(turns):
        resp = answer(ids)
        out.append((ids, resp))
        ids = ids + resp["choices"][0]["token_ids"] + tokenize(url, " " + text_of(200, salt * 100 + k))
    return out


@pytest.fixture(scope="module")
def engines(engine_set, tiny_model, tiny_model_other_weights):
    return engine_set({
        "ref": ("decode", "none", "1", tiny_model, {}),
        "p": ("prefill", "hybrid", "0", tiny_model, {"HYBRID_PD_LEASE_S": "10"}),
        "p_other": ("prefill", "hybrid", "0", tiny_model_other_weights, {"HYBRID_PD_LEASE_S": "10"}),
        "d": ("decode", "hybrid", "1", tiny_model, {}),  # the launchers' deadlines (READ 30 s)
        # vLLM < 0.32's way of reporting loads (no per-request failure channel), forced on this release
        "d_legacy": ("decode", "hybrid", "1", tiny_model, {"HYBRID_PD_TRANSFER_RESULTS": "legacy"}),
        "d_zero": ("decode", "hybrid", "1", tiny_model, controls.ZERO_STATE_ENV),  # zeroes every state it reads
        "d_scramble": ("decode", "hybrid", "1", tiny_model, controls.SCRAMBLE_ENV),  # noise in an attention block
    })


@pytest.fixture(scope="module")
def reference(engines):
    """Every output the module compares against, from one plain engine."""
    ref = engines.up("ref")["ref"]
    out = {"pd": {n: complete(ref, text_of(n, n))["choices"][0]["text"] for n in PD_PROMPTS},
           "another_p": complete(ref, text_of(700, 7_000))["choices"][0]["text"],
           "pd_greedy": {n: greedy_reference(ref, text_of(n, n)) for n in PD_PROMPTS},
           "other": complete(ref, other_prompt(ref))["choices"][0]["text"],
           "other_greedy": greedy_reference(ref, other_prompt(ref)),
           "killed": greedy_reference(ref, text_of(400, 77)),
           "hello": complete(ref, "hello world", max_tokens=2)["choices"][0]["text"]}
    out["noise_floor"] = {n: logprob_delta(out["pd_greedy"][n], complete(ref, text_of(n, n), 12, logprobs=2))
                          for n in PD_PROMPTS}  # the same prompts again, now after their prefix hit
    colocated = conversation(ref, lambda ids: complete(ref, ids, 8, return_token_ids=True), 5, salt=11)
    out["conversation"] = [(ids, r["choices"][0]["text"]) for ids, r in colocated]
    out["branching"] = colocated_pass(ref, turns=6, salt=2)
    ids = tokenize(ref, text_of(300, 31_300))
    first = complete(ref, ids, 8, return_token_ids=True)["choices"][0]["token_ids"]
    nxt = ids + first + tokenize(ref, " " + text_of(200, 32_300))
    answer = complete(ref, nxt, ANSWER_TOKENS, logprobs=2)
    out["failed_load"] = {n: greedy_reference(ref, text_of(n, 90_000 + n)) for n in (350, 700)}
    complete(ref, HIT_PREFIX)
    out["failed_load_hit"] = greedy_reference(ref, HIT_PROMPT)
    out["shipped"] = {"ids": ids, "first": first, "next": nxt, "next_cached": cached(answer),
                      "next_answer": decided_tokens(answer)}
    out["controls"] = controls.both_tails(ref, BS + 2, BS)
    out["junction"] = junction_turns(ref)
    return out


def junction_turns(ref: str) -> dict:
    """An agent loop's two turns: history + a fixed instruction, then history + new words + the instruction
    again (diverging where the instruction began), as token ids; the second turn's answer from one engine."""
    history, instruction = tokenize(ref, text_of(600, 41_600)), tokenize(ref, " " + text_of(300, 41_300))
    nxt = history + tokenize(ref, " " + text_of(200, 41_200)) + instruction
    answer = complete(ref, nxt, ANSWER_TOKENS, logprobs=2)
    return {"prompt": history + instruction, "at": len(history), "next": nxt, "next_answer": decided_tokens(answer)}


def test_the_launcher_names_the_aligned_block_vllm_picked(engines, reference):
    assert f"[hybrid-pd] aligned block: {BS} tokens" in engines.logs["ref"].read_text()


def test_prefiller_with_other_weights_changes_the_output(engines, reference):
    urls = engines.up("p_other", "d")
    before = d_metrics(urls["d"])
    _, d_resp = pd_complete(urls["p_other"], urls["d"], other_prompt(urls["d"]), logprobs=2)
    assert delta(before, d_metrics(urls["d"]))["hybrid_pd_bytes_transferred_sum"] > 0
    assert d_resp["choices"][0]["text"] != reference["other"]
    moved = logprob_delta(reference["other_greedy"]._replace(decided=1), d_resp)  # the first token: same prefix
    PARITY["negative control: P with other weights (first token)"] = moved
    assert moved > tolerance(), moved


def test_one_engines_own_noise_floor(engines, reference):
    """The same prompts again on the reference engine, now after their prefix hit (other chunk shapes, other
    kernels): the spread tolerance() is built from. Every comparison with one engine allows LOGPROB_MARGIN
    times it."""
    for n, floor in reference["noise_floor"].items():
        note_noise_floor(f"one engine, {n} words again", floor)
        assert floor <= LOGPROB_FLOOR, (n, floor)


def other_prompt(url: str) -> list[int]:
    """Two blocks and one token: P computes the two blocks, D only the last token, from P's KV and state (the
    tiny models look back three words, so a longer tail computed on D would hide P's weights)."""
    ids = tokenize(url, text_of(1000, 42))[: 2 * BS + 1]
    assert len(ids) == 2 * BS + 1
    return ids


# connector/transport.py's messages for a READ that failed once D had P's agent (a handshake's name the side
# channel or add_remote_agent)
READ_FAILED = ("NIXL initialize_xfer failed", "NIXL transfer failed", "NIXL READ from", "NIXL check_xfer_state failed",
               "NIXL READ failed")


def test_dead_prefiller_means_recompute_within_the_deadline(engines, reference):
    dead_prefiller_read(engines, reference, "d")


def dead_prefiller_read(engines, reference, decoder: str) -> None:
    """D has read from P before (handshake done); P computes a prompt and dies before D's READ of it: the READ
    itself fails (not a handshake) and D computes the prompt, with the right weights and no wait."""
    urls = engines.up("p_other", decoder)
    pd_complete(urls["p_other"], urls[decoder], text_of(300, 78))  # D knows P's agent from here on
    prompt = text_of(400, 77)
    p_resp = complete(urls["p_other"], prompt, max_tokens=1, kv_transfer_params={"do_remote_decode": True})
    victim = engines.take("p_other")
    for proc in [*victim.descendants(), psutil.Process(victim.pid)]:  # vLLM runs in its own group
        proc.send_signal(signal.SIGKILL)
    victim.stop()
    before = d_metrics(urls[decoder])
    start = time.monotonic()
    d_resp = complete(urls[decoder], prompt, kv_transfer_params=p_resp["kv_transfer_params"], logprobs=2)
    took = time.monotonic() - start
    # a dead peer fails the READ at once: D's own compute is the rest
    assert took < 10, f"D took {took:.1f} s"
    failures = [ln for ln in engines.logs[decoder].read_text().splitlines() if "KV load from" in ln]
    # the READ failed, not a handshake: as it was posted ("NIXL transfer failed"), or as D polled it
    # ("NIXL check_xfer_state failed: NIXL_ERR_REMOTE_DISCONNECT": seen once on the CPU bed, 2026-11-27)
    assert failures and any(stage in failures[-1] for stage in READ_FAILED), failures[-1:]
    # recomputed by D with the right weights: the dead prefiller's (other) weights left no trace
    assert_same_greedy(reference["killed"], d_resp, f"qwen3_next: dead prefiller, recomputed on {decoder}")
    assert delta(before, d_metrics(urls[decoder]))["hybrid_pd_failed_transfers_total"] == 1
    # and D still serves
    assert complete(urls[decoder], "hello world", max_tokens=2)["choices"][0]["text"] == reference["hello"]


def test_another_prefiller_after_one_died_is_handshaken(engines, reference):
    """Another prefiller (new engine id, new ports) after the one D read from died: D simply pairs up. A
    prefiller restarted on the same host:port under a new engine id: tests/e2e/test_chaos.py."""
    urls = engines.up("p", "d")
    before = d_metrics(urls["d"])
    _, d_resp = pd_complete(urls["p"], urls["d"], text_of(700, 7_000))  # a prompt no other test sends
    assert d_resp["choices"][0]["text"] == reference["another_p"]
    m = delta(before, d_metrics(urls["d"]))
    assert m["hybrid_pd_bytes_transferred_count"] == 1 and m["hybrid_pd_failed_transfers_total"] == 0


@pytest.mark.parametrize("n_words", sorted(PD_PROMPTS))
def test_pd_greedy_output_equals_one_engine(engines, reference, n_words):
    urls = engines.up("p", "d")
    before = d_metrics(urls["d"])
    p_resp, d_resp = pd_complete(urls["p"], urls["d"], text_of(n_words, n_words), logprobs=1)
    assert_same_greedy(reference["pd_greedy"][n_words], d_resp, f"PD, {n_words} words")
    moved = delta(before, d_metrics(urls["d"]))
    assert moved["hybrid_pd_bytes_transferred_count"] == 1 and moved["hybrid_pd_bytes_transferred_sum"] > 0
    assert moved["hybrid_pd_failed_transfers_total"] == 0


def test_every_pd_turn_moves_the_minimal_bytes(engines, reference):
    """Bytes = attention blocks D lacks + one state per GDN layer (+ one checkpoint per layer if shipped).

    The first two terms are the floor (upstream moves exactly these: 661,504 B for 2 blocks + 2 states). A
    turn whose new tokens do not cross the block boundary P stops at moves nothing: D's attention blocks from
    the last turn already reach it, and D computes from the boundary where its own Mamba checkpoint is.
    """
    urls = engines.up("p", "d")
    report = []
    for k, (prompt, expected) in enumerate(reference["conversation"]):
        before = d_metrics(urls["d"])
        p_resp, d_resp = pd_complete(urls["p"], urls["d"], prompt, max_tokens=8)
        assert d_resp["choices"][0]["text"] == expected
        m = delta(before, d_metrics(urls["d"]))
        n = p_resp["kv_transfer_params"]["remote_num_tokens"]
        local_hit = int(m["prefix_cache_hits_total"])
        checkpoints = int(m.get("hybrid_pd_checkpoints_shipped_total", 0))  # one per Mamba group (= all GDN layers)
        minimal = minimal_bytes(n, local_hit) if m.get("hybrid_pd_bytes_transferred_count") else 0
        assert m.get("hybrid_pd_bytes_transferred_sum", 0) == minimal + checkpoints * MAMBA_LAYERS * STATE
        assert checkpoints in (0, 1)
        report.append((k + 1, n, local_hit, int(m.get("hybrid_pd_bytes_transferred_sum", 0)), minimal,
                       int(m.get("hybrid_pd_descriptors_sum", 0)), checkpoints))
    assert sum(1 for row in report if row[3]) >= len(report) // 2, report  # most turns read from P
    print("\nturn, tokens on P, D's own hit, bytes moved, minimal (no checkpoint), descriptors, checkpoints")
    for row in report:
        print(*row)


def test_next_turn_straight_to_decoder_hits_the_boundary_p_computed(engines, reference):
    """Turn k through PD, turn k+1 straight to D: D's hit reaches P's last block boundary (upstream: 0), as one
    engine's does, and D's answer from that state is one engine's answer.

    P stops at the last block boundary below the prompt's end, so the state D resumes from is that boundary's
    checkpoint: D caches it as its own and nothing else crosses (no separate checkpoint). A prompt neither
    engine has seen (300 words); `test_next_turn_straight_to_decoder_hits_and_answers_as_one_engine` follows a
    conversation.
    """
    urls = engines.up("p", "d")
    ids, first, nxt, bar = (reference["shipped"][k] for k in ("ids", "first", "next", "next_cached"))
    before = d_metrics(urls["d"])
    p_resp, d_resp = pd_complete(urls["p"], urls["d"], ids, max_tokens=8, return_token_ids=True)
    assert d_resp["choices"][0]["token_ids"] == first
    n = p_resp["kv_transfer_params"]["remote_num_tokens"]
    boundary = n
    assert n % BS == 0 and p_resp["kv_transfer_params"]["checkpoints"] == []
    assert delta(before, d_metrics(urls["d"])).get("hybrid_pd_checkpoints_shipped_total", 0) == 0
    resp = complete(urls["d"], nxt, ANSWER_TOKENS, logprobs=2)
    compared = assert_same_greedy(reference["shipped"]["next_answer"], resp, "decoder-alone turn")
    print(f"\n{n} tokens on P: D resumes at {boundary}; next turn straight to D: {cached(resp)} cached tokens "
          f"(one engine: {bar}), {compared} of {ANSWER_TOKENS} decided tokens equal")
    assert cached(resp) == bar == boundary == 256


def test_next_turn_straight_to_decoder_hits_and_answers_as_one_engine(engines, reference):
    """Turn k through PD, then a branch of turn k+1 straight to D, for k = 1..6 of a conversation neither
    engine has seen: D reports at least the cached tokens one colocated engine reports for the same sequence of
    requests (more where the boundary P stopped at is one the engine did not keep), and answers the branch
    with that engine's greedy tokens. The first turn's hit comes from the state P computed (D never computed
    that boundary itself), so its answer proves those bytes and the hash D cached them under. (Upstream's
    NixlConnector hits 0, 256, 512, 512, 768, 1024 where the engine reports 256, 256, 512, 512, 1024, 1280;
    benchmarks/results/2026-11-22-cpu-connector/summary.md.)"""
    urls = engines.up("p", "d")
    conv = reference["branching"]
    got, compared = [], []
    for prompt, text, branch, answer in zip(conv["prompts"], conv["texts"], conv["branches"],
                                            conv["branch_answers"]):
        _, pd_resp = pd_complete(urls["p"], urls["d"], prompt, max_tokens=ANSWER_TOKENS)
        assert pd_resp["choices"][0]["text"] == text  # the PD turn itself answers as the engine did
        resp = complete(urls["d"], branch, ANSWER_TOKENS, logprobs=2)
        got.append(cached(resp))
        compared.append(assert_same_greedy(answer, resp, "decoder-alone branches of a conversation"))
    print(f"\nnext turn straight to D, k = 1..{len(got)}: ours {got}, one engine {conv['cached_next']}; "
          f"decided tokens compared {compared} of {ANSWER_TOKENS} each")
    assert all(ours >= engine for ours, engine in zip(got, conv["cached_next"])), (got, conv["cached_next"])
    assert got[0] > 0


def test_a_junction_stop_leaves_the_decoder_the_state_where_the_next_turn_diverges(engines, reference):
    """P asked to stop at a junction (a token position: where an agent loop's fixed last instruction begins,
    proxy/pd_flow.py): P stops at the block boundary at or below it and D computes the rest itself. The next
    turn, which diverges there, straight to D: D hits that boundary, from P's state (D never computed it), and
    answers as one engine. The same turn after P stopped at its last boundary (the default) hits nothing below
    the divergence: the control."""
    urls = engines.up("p", "d")
    j = reference["junction"]
    n, junction = len(j["prompt"]), j["at"] // BS * BS
    assert 0 < junction < (n - 1) // BS * BS  # the default stop lies past the divergence
    p_resp, _ = pd_complete(urls["p"], urls["d"], j["prompt"], max_tokens=4, p_params={PREFILL_STOP: j["at"]})
    assert p_resp["kv_transfer_params"]["remote_num_tokens"] == junction
    resp = complete(urls["d"], j["next"], ANSWER_TOKENS, logprobs=2)
    compared = assert_same_greedy(j["next_answer"], resp, "decoder-alone turn from a junction stop")
    other = tokenize(urls["d"], text_of(600, 42_600))  # the control: another history, P to its last boundary
    rest = j["prompt"][j["at"]:]
    p_resp, _ = pd_complete(urls["p"], urls["d"], other + rest, max_tokens=4)
    control = complete(urls["d"], other + j["next"][j["at"]:], 2)
    print(f"\njunction at {j['at']} of {n} tokens: P stopped at {junction}; the next turn straight to D hits "
          f"{cached(resp)} ({compared} decided tokens equal); after a stop at the last boundary "
          f"({p_resp['kv_transfer_params']['remote_num_tokens']}) it hits {cached(control)}")
    assert cached(resp) == junction and cached(control) < len(other) // BS * BS


def post_and_hang_up(url: str, body: dict) -> None:
    """Stream a request and hang up at its first token: D has read its KV and is decoding; vLLM aborts it
    (no timing guess: a blind early hang-up could land before vLLM even saw the request)."""
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps({**body, "stream": True}).encode()
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        seen = b""
        while b"data:" not in seen:
            chunk = sock.recv(4096)
            assert chunk, "D closed the stream before its first token"
            seen += chunk


def test_no_prefiller_block_outlives_its_decode_aborted_or_not(engines):
    """Many PD requests, one in three aborted by its client, one in three repeating an earlier prompt (D reads
    only the tail past its own hit): P gets every block back from D's messages, well before any lease (10 s)
    could expire them."""
    urls = engines.up("p", "d")
    deadline = time.monotonic() + 30
    while d_metrics(urls["p"])["kv_cache_usage_perc"] > 0:  # whatever earlier tests left on lease
        assert time.monotonic() < deadline, "prefiller still holds blocks"
        time.sleep(0.5)
    for i in range(9):
        prompt = text_of(350, 7000 + (i - 2 if i % 3 == 2 else i))
        p_resp = complete(urls["p"], prompt, max_tokens=1, kv_transfer_params={"do_remote_decode": True})
        body = {"model": "tiny", "prompt": prompt, "max_tokens": 32, "temperature": 0.0, "ignore_eos": True,
                "kv_transfer_params": p_resp["kv_transfer_params"]}
        assert d_metrics(urls["p"])["kv_cache_usage_perc"] > 0  # pinned for D
        start = time.monotonic()
        if i % 3 == 1:
            post_and_hang_up(urls["d"], body)
        else:
            complete(urls["d"], prompt, max_tokens=4, kv_transfer_params=p_resp["kv_transfer_params"])
        while d_metrics(urls["p"])["kv_cache_usage_perc"] > 0:
            assert time.monotonic() - start < 5, f"request {i}: P's blocks wait for their lease, D never told P"
            time.sleep(0.1)


def test_prefiller_frees_every_block_once_decoder_is_done(engines):
    urls = engines.up("p", "d")
    deadline = time.monotonic() + 30
    while d_metrics(urls["p"])["kv_cache_usage_perc"] > 0:  # leases end when D says done
        assert time.monotonic() < deadline, "prefiller still holds blocks"
        time.sleep(0.5)
    # a prefill whose decode never comes is freed when its lease (10 s here) expires
    complete(urls["p"], text_of(300, 4242), max_tokens=1, kv_transfer_params={"do_remote_decode": True})
    assert d_metrics(urls["p"])["kv_cache_usage_perc"] > 0
    deadline = time.monotonic() + 60
    while d_metrics(urls["p"])["kv_cache_usage_perc"] > 0:
        assert time.monotonic() < deadline, "lease did not expire"
        time.sleep(1)


@pytest.mark.parametrize("decoder", ["d", "d_legacy"])
def test_a_failed_load_is_computed_on_the_decoder_never_decoded_from_unloaded_blocks(engines, reference, decoder):
    """P's params carry no handshake (as an older prefiller's) and point D at a side channel where nobody
    answers: the READ never happens. D must compute the prompt itself (from its own hit where it has one) and
    answer exactly as one engine, on vLLM >= 0.32's per-request failure channel and on the older path (failure
    rewound by the scheduler side)."""
    urls = engines.up("p", decoder, ahead=("p_other",) if decoder == "d_legacy" else ())  # the next test's

    def failed_pd(prompt: str) -> dict:
        p_resp = complete(urls["p"], prompt, max_tokens=1, kv_transfer_params={"do_remote_decode": True})
        assert p_resp["kv_transfer_params"]["handshakes"]  # P's own handshake rides along (base64)
        params = {**p_resp["kv_transfer_params"], "remote_port": free_port(), "handshakes": []}
        before = d_metrics(urls[decoder])
        d_resp = complete(urls[decoder], prompt, kv_transfer_params=params, logprobs=2)
        assert delta(before, d_metrics(urls[decoder]))["hybrid_pd_failed_transfers_total"] == 1
        return d_resp

    label = f"qwen3_next: failed-load fallback on {decoder}"
    for n in (350, 700):  # nothing cached on D
        assert_same_greedy(reference["failed_load"][n], failed_pd(text_of(n, 90_000 + n)), label)
    complete(urls[decoder], HIT_PREFIX)  # D caches a prefix (256 tokens): the failed load has a local hit
    assert_same_greedy(reference["failed_load_hit"], failed_pd(HIT_PROMPT), label + " over a local hit")


def test_a_failed_read_on_the_pre_032_path_is_computed_on_the_decoder(engines, reference):
    """The same dead-prefiller READ on vLLM < 0.32's way of reporting loads (forced on this release); placed
    last, beside the other d_legacy test, so that D_LEGACY starts once."""
    dead_prefiller_read(engines, reference, "d_legacy")


@pytest.mark.parametrize("control,tail", controls.CASES)
def test_decoder_alone_turn_moves_when_the_shipped_bytes_are_wrong(engines, reference, control, tail):
    """A turn served by D alone from a boundary whose shipped bytes were spoiled (tests/support/controls.py), D
    computing the last two prompt tokens or a long tail itself: D's answer must move away from one engine's. From
    healthy bytes it stays within the tolerance. Placed last: the decoder that zeroes what it reads starts once."""
    decoder = controls.OWN_DECODER.get(control, "d")
    urls = engines.up("p", decoder, ahead=("d_scramble",) if decoder == "d_zero" else ())
    moved = controls.check(urls["p"], urls[decoder], controls.group_kinds(engines.logs["p"]),
                           reference["controls"][tail], control, BS)
    controls.report("qwen3_next", moved)
    if control == "healthy":
        PARITY[f"qwen3_next: decoder-alone turn, control prompt, {tail} tail"] = moved.top1_delta
        assert moved.same_greedy and moved.top1_delta <= tolerance(), moved
    else:
        controls.expect_moved("qwen3_next", moved, tail)
