"""KV integrity digests with real engines: bytes corrupted in flight on the decoder are caught before the
request is scheduled, the load fails, D recomputes and answers as one engine, and the mismatch is counted.

Three engines from the session's pool (tests/support/engines.py): REF (`--connector none`) computes the
references, then P (digests on, the default: the test checks P sent them) + D, where D's test hook
(HYBRID_PD_TEST_CORRUPT_READS=1) flips a byte in the blocks its first READ landed, before it checks them against
P's digests.
"""

from __future__ import annotations

import re

import pytest

from tests.support.conversation import assert_same_greedy, greedy_reference, text_of
from tests.support.engines import pd_complete
from tests.support.procs import metric_sum, scrape_metrics

pytestmark = pytest.mark.engines

CORRUPTED, HEALTHY = text_of(700, 97_001), text_of(600, 97_002)  # P ships 2 attention blocks + the state


@pytest.fixture(scope="module")
def engines(engine_set, tiny_model):
    return engine_set({
        "ref": ("decode", "none", "1", tiny_model, {}),
        "p": ("prefill", "hybrid", "0", tiny_model, {"HYBRID_PD_LEASE_S": "10"}),
        "d": ("decode", "hybrid", "1", tiny_model, {"HYBRID_PD_KV_DIGESTS": "1", "HYBRID_PD_TEST_CORRUPT_READS": "1"}),
    })


@pytest.fixture(scope="module")
def reference(engines):
    ref = engines.up("ref")["ref"]
    return {prompt: greedy_reference(ref, prompt) for prompt in (CORRUPTED, HEALTHY)}


def counters(url: str) -> dict[str, float]:
    m = scrape_metrics(url)
    return {k: metric_sum(m, f"vllm:hybrid_pd_{k}") for k in (
        "digest_mismatches_total", "failed_transfers_total", "bytes_transferred_sum", "bytes_transferred_count")}


def test_bytes_corrupted_in_flight_are_recomputed_never_decoded_and_counted(engines, reference):
    urls = engines.up("p", "d")
    before = counters(urls["d"])
    p_resp, d_resp = pd_complete(urls["p"], urls["d"], CORRUPTED, logprobs=1)
    digests = p_resp["kv_transfer_params"]["digests"]
    assert digests and all(g["digests"] for g in digests["ranks"][0]), digests  # P digested every group
    after = counters(urls["d"])
    assert after["digest_mismatches_total"] - before["digest_mismatches_total"] == 1  # caught, counted
    assert after["failed_transfers_total"] - before["failed_transfers_total"] == 1  # a failed load: recomputed
    assert_same_greedy(reference[CORRUPTED], d_resp)  # D's own compute, as one engine

    # the hook corrupts one load only: a healthy transfer is checked, passes, and is decoded from P's KV
    _, d_resp = pd_complete(urls["p"], urls["d"], HEALTHY, logprobs=1)
    healthy = counters(urls["d"])
    assert healthy["digest_mismatches_total"] == after["digest_mismatches_total"]
    assert healthy["failed_transfers_total"] == after["failed_transfers_total"]
    assert healthy["bytes_transferred_count"] - after["bytes_transferred_count"] == 1
    assert_same_greedy(reference[HEALTHY], d_resp)
    loads = re.findall(r"hybrid-pd load \S+: .* failed=(\w+), .* blocks verified=(\d+), digest mismatch=(\w+)",
                       engines.logs["d"].read_text())
    assert loads[-1][0] == "False" and int(loads[-1][1]) >= 3 and loads[-1][2] == "False", loads
