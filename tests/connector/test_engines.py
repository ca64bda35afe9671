"""Real engines with our connector, started by the launchers: PD equals one engine, moves minimal bytes,
ships Mamba checkpoints D can reuse, survives a dead prefiller, and leaks no blocks on P.

Never more than two engines at once (2-core test bed): first REF (`--connector none`) computes every
reference output, then P_OTHER (other weights) + D, then P + D: D outlives the killed P_OTHER and pairs
with P, a new prefiller, without a restart.
"""

from __future__ import annotations

import random
import signal
import time

import psutil
import pytest

from tests.support.procs import free_port, http_json, metric_sum, scrape_metrics, worker_argv

pytestmark = pytest.mark.engines

WORDS = ("the quick brown fox jumps over the lazy dog prefix cache mamba state attention block token "
         "decode prefill engine server request model hello world one two three").split()
BS, ATTN_LAYERS, MAMBA_LAYERS = 256, 2, 2  # the tiny model on CPU
PAGE, STATE = 131072, 68608  # bytes of one attention block / one GDN state, per layer
PD_PROMPTS = {n: f"{n}" for n in (20, 300, 700)}


def text_of(n_words: int, salt: int) -> str:
    rng = random.Random(salt)
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def tokenize(url: str, text: str) -> list[int]:
    return http_json(url + "/tokenize", {"model": "tiny", "prompt": text, "add_special_tokens": False})["tokens"]


def complete(url: str, prompt: str | list[int], max_tokens: int = 12, **extra) -> dict:
    return http_json(url + "/v1/completions", {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens,
                                               "temperature": 0.0, "ignore_eos": True, **extra}, timeout=120)


def cached(resp: dict) -> int:
    return (resp["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0


def conversation(url: str, answer, turns: int, salt: int) -> list[tuple[list[int], dict]]:
    """Turn k+1 = turn k's prompt + its answer + new words, as token ids (text would re-tokenize across
    the seams and move block hashes); `answer(ids)` returns the response (with token ids)."""
    ids, out = tokenize(url, text_of(300, salt)), []
    for k in range(turns):
        resp = answer(ids)
        out.append((ids, resp))
        ids = ids + resp["choices"][0]["token_ids"] + tokenize(url, " " + text_of(200, salt * 100 + k))
    return out


class Engines:
    """Named engines, at most two running; `up()` stops the others and starts what is missing."""

    def __init__(self, launch, tiny_model, other_model):
        self.launch, self.running = launch, {}
        self.specs = {
            "ref": ("decode", "none", "1", tiny_model, {}),
            "p": ("prefill", "hybrid", "0", tiny_model, {"HYBRID_PD_LEASE_S": "10"}),
            "p_other": ("prefill", "hybrid", "0", other_model, {"HYBRID_PD_LEASE_S": "10"}),
            "d": ("decode", "hybrid", "1", tiny_model, {"HYBRID_PD_READ_TIMEOUT_S": "10"}),
        }

    def up(self, *names):
        for name in [n for n in self.running if n not in names]:
            self.running.pop(name).stop()
        started = []
        for name in names:
            if name not in self.running:
                role, connector, cpu, model, env = self.specs[name]
                port = free_port()
                argv = worker_argv(role, connector=connector, port=port, cpu_bind=cpu, model=model)
                self.running[name] = self.launch(name, argv, f"http://127.0.0.1:{port}", env)
                started.append(name)
        for name in started:
            self.running[name].wait_healthy(300)
        return {n: self.running[n].url for n in names}


@pytest.fixture(scope="module")
def engines(launch, tiny_model, tiny_model_other_weights):
    return Engines(launch, tiny_model, tiny_model_other_weights)


@pytest.fixture(scope="module")
def reference(engines):
    """Every output the module compares against, from one plain engine."""
    ref = engines.up("ref")["ref"]
    out = {"pd": {n: complete(ref, text_of(n, n))["choices"][0]["text"] for n in PD_PROMPTS},
           "other": complete(ref, text_of(500, 42))["choices"][0]["text"],
           "killed": complete(ref, text_of(400, 77))["choices"][0]["text"]}
    colocated = conversation(ref, lambda ids: complete(ref, ids, 8, return_token_ids=True), 5, salt=11)
    out["colocated_cached"] = [cached(r) for _, r in colocated[1:]]
    out["conversation"] = [(ids, r["choices"][0]["text"]) for ids, r in colocated]
    out["branch"] = [tokenize(ref, f" turn{k}") for k in range(5)]
    out["new_words"] = [tokenize(ref, " " + text_of(200, 9000 + k)) for k in range(5)]
    return out


def pd_complete(p_url: str, d_url: str, prompt: str | list[int], max_tokens: int = 12,
                **extra) -> tuple[dict, dict]:
    p_resp = complete(p_url, prompt, max_tokens=1, kv_transfer_params={"do_remote_decode": True})
    params = p_resp.get("kv_transfer_params")
    assert params and params["remote_block_ids"], p_resp
    return p_resp, complete(d_url, prompt, max_tokens, kv_transfer_params=params, **extra)


def d_metrics(url: str) -> dict[str, float]:
    m = scrape_metrics(url)
    return {k: metric_sum(m, f"vllm:{k}") for k in (
        "hybrid_pd_bytes_transferred_sum", "hybrid_pd_bytes_transferred_count", "hybrid_pd_descriptors_sum",
        "hybrid_pd_checkpoints_shipped_total", "hybrid_pd_failed_transfers_total", "prefix_cache_hits_total",
        "kv_cache_usage_perc")}


def delta(before: dict, after: dict) -> dict:
    return {k: after[k] - before[k] for k in before}


def test_prefiller_with_other_weights_changes_the_output(engines, reference):
    urls = engines.up("p_other", "d")
    before = d_metrics(urls["d"])
    _, d_resp = pd_complete(urls["p_other"], urls["d"], text_of(500, 42))
    assert delta(before, d_metrics(urls["d"]))["hybrid_pd_bytes_transferred_sum"] > 0
    assert d_resp["choices"][0]["text"] != reference["other"]


def test_dead_prefiller_means_recompute_within_the_deadline(engines, reference):
    urls = engines.up("p_other", "d")
    prompt = text_of(400, 77)
    p_resp = complete(urls["p_other"], prompt, max_tokens=1, kv_transfer_params={"do_remote_decode": True})
    victim = engines.running.pop("p_other")
    for proc in [*victim.descendants(), psutil.Process(victim.pid)]:  # vLLM runs in its own group
        proc.send_signal(signal.SIGKILL)
    victim.stop()
    before = d_metrics(urls["d"])
    start = time.monotonic()
    d_resp = complete(urls["d"], prompt, kv_transfer_params=p_resp["kv_transfer_params"])
    took = time.monotonic() - start
    assert took < 30, f"D took {took:.1f} s"
    # recomputed by D with the right weights: the dead prefiller's (other) weights left no trace
    assert d_resp["choices"][0]["text"] == reference["killed"]
    assert delta(before, d_metrics(urls["d"]))["hybrid_pd_failed_transfers_total"] == 1
    # and D still serves
    assert complete(urls["d"], "hello world", max_tokens=2)["choices"][0]["text"] is not None


def test_restarted_prefiller_is_handshaken_again(engines, reference):
    """A new prefiller (new engine id, same side-channel role) after the old one died: D simply pairs up."""
    urls = engines.up("p", "d")
    before = d_metrics(urls["d"])
    _, d_resp = pd_complete(urls["p"], urls["d"], text_of(700, 700))
    assert d_resp["choices"][0]["text"] == reference["pd"][700]
    m = delta(before, d_metrics(urls["d"]))
    assert m["hybrid_pd_bytes_transferred_count"] == 1 and m["hybrid_pd_failed_transfers_total"] == 0


@pytest.mark.parametrize("n_words", sorted(PD_PROMPTS))
def test_pd_greedy_output_equals_one_engine(engines, reference, n_words):
    urls = engines.up("p", "d")
    before = d_metrics(urls["d"])
    _, d_resp = pd_complete(urls["p"], urls["d"], text_of(n_words, n_words))
    assert d_resp["choices"][0]["text"] == reference["pd"][n_words]
    moved = delta(before, d_metrics(urls["d"]))
    assert moved["hybrid_pd_bytes_transferred_count"] == 1 and moved["hybrid_pd_bytes_transferred_sum"] > 0
    assert moved["hybrid_pd_failed_transfers_total"] == 0


def test_every_pd_turn_moves_the_minimal_bytes(engines, reference):
    """Bytes = attention blocks D lacks + one state per GDN layer (+ one checkpoint per layer if shipped).

    The first two terms are the floor (upstream moves exactly these: 661,504 B for 2 blocks + 2 states).
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
        new_blocks = -(-n // BS) - local_hit // BS
        checkpoints = int(m["hybrid_pd_checkpoints_shipped_total"])  # one per Mamba group (= all GDN layers)
        minimal = new_blocks * ATTN_LAYERS * PAGE + MAMBA_LAYERS * STATE
        assert m["hybrid_pd_bytes_transferred_sum"] == minimal + checkpoints * MAMBA_LAYERS * STATE
        assert checkpoints in (0, 1)
        report.append((k + 1, n, local_hit, int(m["hybrid_pd_bytes_transferred_sum"]), minimal,
                       int(m["hybrid_pd_descriptors_sum"]), checkpoints))
    print("\nturn, tokens on P, D's own hit, bytes moved, minimal (no checkpoint), descriptors, checkpoints")
    for row in report:
        print(*row)


def test_next_turn_straight_to_decoder_hits_the_shipped_checkpoint(engines, reference):
    """Turn k through PD, turn k+1 straight to D: D's hit reaches P's last block boundary (upstream: 0).

    A prompt neither engine has seen (300 words: P keeps its state at 256 tokens). For longer fresh
    prompts vLLM 0.32's align mode on P kept no boundary state in our runs, so there is nothing to ship;
    `test_conversation_next_turn_straight_to_decoder` prints what happens along a conversation.
    """
    urls = engines.up("p", "d")
    ids = tokenize(urls["d"], text_of(300, 31_300))
    before = d_metrics(urls["d"])
    p_resp, d_resp = pd_complete(urls["p"], urls["d"], ids, max_tokens=8, return_token_ids=True)
    n = p_resp["kv_transfer_params"]["remote_num_tokens"]
    boundary = n // BS * BS
    assert n % BS and [c["tokens"] for c in p_resp["kv_transfer_params"]["checkpoints"]] == [boundary]
    assert delta(before, d_metrics(urls["d"]))["hybrid_pd_checkpoints_shipped_total"] == 1
    nxt = ids + d_resp["choices"][0]["token_ids"] + tokenize(urls["d"], " " + text_of(200, 32_300))
    got = cached(complete(urls["d"], nxt, max_tokens=1))
    print(f"\n{n} tokens on P: checkpoint at {boundary}; next turn straight to D: {got} cached tokens")
    assert got >= boundary == 256


def test_conversation_next_turn_straight_to_decoder(engines, reference):
    """The same along a conversation whose earlier turns both engines already hold (prints the table).

    vLLM's align mode does not keep every boundary state of a request that resumed from a prefix hit (a
    colocated engine shows the same gaps, see `colocated_cached`), so P ships the deepest checkpoint it
    still holds; whatever D reads is hit on the next turn.
    """
    urls = engines.up("p", "d")
    conv = reference["conversation"]
    rows = []
    for k in range(len(conv) - 1):
        prompt = conv[k][0] + reference["branch"][k]  # a fresh branch of the conversation: D has not seen it
        before = d_metrics(urls["d"])
        p_resp, d_resp = pd_complete(urls["p"], urls["d"], prompt, max_tokens=8, return_token_ids=True)
        params = p_resp["kv_transfer_params"]
        n = params["remote_num_tokens"]
        read = delta(before, d_metrics(urls["d"]))["hybrid_pd_checkpoints_shipped_total"]
        shipped = max([c["tokens"] for c in params["checkpoints"]], default=0) if read else 0
        nxt = prompt + d_resp["choices"][0]["token_ids"] + reference["new_words"][k]
        got = cached(complete(urls["d"], nxt, max_tokens=1))
        rows.append((k + 1, n, n // BS * BS, shipped, got))
        assert got >= shipped, rows
    print("\nturn, tokens on P, last boundary, checkpoint read by D at, cached tokens next turn straight to D")
    for row in rows:
        print(*row)
    print("colocated engine, same conversation:", reference["colocated_cached"])


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
