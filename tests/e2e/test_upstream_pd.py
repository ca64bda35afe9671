"""Real engines started by our launchers: one colocated engine in align mode, and a PD pair on vLLM's own
NixlConnector (the baseline), plus a prefiller with other weights as the negative control.

Engines: REF (no connector, core 1), P (producer, core 0), P_OTHER (producer, core 0, other weights: random
"dummy" weights from the same model folder, since upstream's handshake refuses a peer whose model path
differs), D (consumer, core 1), all from the session's pool (tests/support/engines.py; REF is other modules' too).
The PD flow is the toy proxy's, done here by hand, so this module does not depend on
our proxy or our connector.
"""

import os
import time

import psutil
import pytest

from tests.support.conversation import assert_same_greedy, greedy_reference, text_of
from tests.support.engines import Spec
from tests.support.procs import http_json, metric_sum, scrape_metrics

pytestmark = pytest.mark.engines

def transferred_bytes(d_url: str) -> float:
    return metric_sum(scrape_metrics(d_url), "vllm:nixl_bytes_transferred_sum")


@pytest.fixture(scope="module")
def engines(engine_set, tiny_model):
    engines = engine_set({
        "ref": ("decode", "none", "1", tiny_model),
        "p": ("prefill", "upstream", "0", tiny_model),
        "p_other": Spec.of("prefill", "upstream", "0", tiny_model, vllm_args=("--load-format", "dummy")),
        "d": ("decode", "upstream", "1", tiny_model),
    })
    engines.up("ref", "p", "p_other", "d")
    return engines


def complete(url: str, prompt: str, max_tokens: int = 12, **extra) -> dict:
    return http_json(url + "/v1/completions", {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens,
                                               "temperature": 0.0, "ignore_eos": True, **extra})


def pd_complete(p_url: str, d_url: str, prompt: str, max_tokens: int = 12, **extra) -> tuple[dict, dict]:
    p_resp = complete(p_url, prompt, max_tokens=1, kv_transfer_params={
        "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
        "remote_block_ids": None, "remote_host": None, "remote_port": None})
    assert p_resp.get("kv_transfer_params"), p_resp
    return p_resp, complete(d_url, prompt, max_tokens, kv_transfer_params=p_resp["kv_transfer_params"], **extra)


def cached(resp: dict) -> int:
    return (resp["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0


def test_colocated_engine_hits_its_prefix_cache_in_align_mode(engines):
    prompt = text_of(600, salt=1)
    first = complete(engines["ref"].url, prompt)
    again = complete(engines["ref"].url, prompt)
    n = first["usage"]["prompt_tokens"]
    assert n > 512 and cached(first) == 0
    # align mode: hits land on whole attention blocks (256 tokens for the tiny model on CPU)
    assert cached(again) == (n - 1) // 256 * 256 >= 512
    assert again["choices"][0]["text"] == first["choices"][0]["text"]


@pytest.mark.parametrize("n_words", [20, 300, 700])
def test_pd_greedy_output_equals_one_engine(engines, n_words):
    prompt = text_of(n_words, salt=n_words)
    expected = greedy_reference(engines["ref"].url, prompt)
    before = transferred_bytes(engines["d"].url)
    p_resp, d_resp = pd_complete(engines["p"].url, engines["d"].url, prompt, logprobs=1)
    assert p_resp["kv_transfer_params"]["remote_block_ids"]
    assert_same_greedy(expected, d_resp, "upstream NixlConnector: PD")
    assert transferred_bytes(engines["d"].url) > before  # D really pulled P's KV (no silent recompute)


def test_prefiller_with_other_weights_changes_the_output(engines):
    prompt = text_of(500, salt=42)  # a prompt no engine has seen: D must take P_OTHER's KV
    expected = complete(engines["ref"].url, prompt)["choices"][0]["text"]
    before = transferred_bytes(engines["d"].url)
    _, d_resp = pd_complete(engines["p_other"].url, engines["d"].url, prompt)
    assert transferred_bytes(engines["d"].url) > before
    assert d_resp["choices"][0]["text"] != expected
    # ...and the same decoder still matches when fed by the right prefiller
    _, d_ok = pd_complete(engines["p"].url, engines["d"].url, text_of(500, salt=43))
    assert d_ok["choices"][0]["text"] == complete(engines["ref"].url, text_of(500, salt=43))["choices"][0]["text"]


def test_idle_workers_do_not_spin_a_core(engines):
    """NIXL's progress thread polls with a 0 us delay unless our vLLM plugin applies NIXL_PTHR_DELAY_US."""
    procs = [pid for name in ("p", "d")
             for pid in [engines[name].pid, *[c.pid for c in engines[name].descendants()]]]
    def cpu_seconds():
        total = 0.0
        for pid in procs:
            try:
                t = psutil.Process(pid).cpu_times()
                total += t.user + t.system
            except psutil.NoSuchProcess:
                pass
        return total

    start, t0 = cpu_seconds(), time.monotonic()
    time.sleep(5)
    cores = (cpu_seconds() - start) / (time.monotonic() - t0)
    assert cores < 0.4, f"two idle PD workers use {cores:.2f} cores"


def test_the_upstream_prefillers_forward_thread_stays_on_its_core(engines):
    """vLLM's NixlConnector moves a CPU worker's main (forward) thread onto the last core of the NUMA node: the
    decoder's core here, where P's forward waited behind D's spinning worker (0.13-0.78 s prefill legs instead of
    43-80 ms). The launcher's affinity guard keeps it on its --cpu-bind core (connector/affinity_guard.py)."""
    workers = [c for c in engines["p"].descendants() if "Worker" in " ".join([c.name(), *c.cmdline()])]
    assert workers
    for w in workers:
        assert os.sched_getaffinity(w.pid) == {0}, f"P's forward thread runs on {os.sched_getaffinity(w.pid)}"
    assert "ignored a move to [1]" in engines["p"].log_path.read_text()


def test_launchers_stop_vllm_and_its_engine_core_on_sigterm(engines):
    d = engines.take("d")  # no later module gets the decoder this test stops
    children = d.descendants()
    assert len(children) >= 2  # vLLM's API server and its engine core, under our launcher
    assert d.stop() == []  # nothing needed SIGKILL
    assert d.proc.returncode == 0
    assert not any(c.is_running() for c in children)
