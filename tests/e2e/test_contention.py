"""Under contention: a prefiller and a decoder that share a core, with a busy neighbour spinning on it.

Shared cores are normal on a laptop, in the cpu-dev overlay and in pods with CPU limits. Two layouts:
- `one core`: P and D pinned to core 0 with the neighbour. Earlier releases lost every KV load here ("no
  handshake ... within 5 s": D recomputed, TTFT went from ~0.3 to 5.4 s, and P held the unread blocks under its
  120 s lease).
- `spanning`: P on core 0, D on cores 0-1 (the 2P1D layout of benchmarks/burst_bench.py), with the neighbour
  on core 0. Every load failed here (10 of 10) until D's NIXL progress thread stopped spinning through the
  first READ's set-up and D stopped stepping non-stop while it waited
  (benchmarks/results/2026-11-24-cpu-burst/summary.md).
With real engines, our connector and our proxy: a burst of new prompts (the first READ from P happens inside
it), then turns one at a time. Every load must succeed with no recompute, P must free its blocks within a
second of D's read, and the decoder's launcher must warn that it shares a core with the prefiller.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from tests.support.conversation import complete, text_of
from tests.support.procs import HYBRID_PD, free_port, kv_events, metric_sum, scrape_metrics, worker_argv

pytestmark = pytest.mark.engines

CORE = "0"  # the prefiller's and the busy neighbour's
LAYOUTS = {"one core": "0", "spanning": "0-1"}  # the decoder's cores


@pytest.fixture(scope="module")
def prefiller(launch, tiny_model):
    """P on core 0, started alone; both layouts use it (one start less)."""
    port = free_port()
    argv = worker_argv("prefill", connector="hybrid", port=port, cpu_bind=CORE, model=tiny_model)
    p = launch("prefill", argv, f"http://127.0.0.1:{port}")
    p.wait_healthy(400)
    return p


@pytest.fixture(scope="module", params=list(LAYOUTS))
def shared_core(request, launch, tiny_model, prefiller):
    """D in the layout's cores (started after P: its launcher finds P), the proxy, and the busy neighbour on core 0,
    spinning from when both engines serve (what the tests measure) until the layout is done (a start beside it
    takes twice as long)."""
    d_cores = LAYOUTS[request.param]
    tag = request.param.replace(" ", "-")
    port = free_port()
    argv = worker_argv("decode", connector="hybrid", port=port, cpu_bind=d_cores, model=tiny_model)
    d = launch(f"{tag}-decode", argv, f"http://127.0.0.1:{port}")
    d.wait_healthy(400)
    proxy_port = free_port()
    proxy = launch(f"{tag}-proxy", [HYBRID_PD, "proxy", "--port", str(proxy_port), "--prefill", prefiller.url,
                                    "--decode", d.url, "--prefill-events", kv_events(prefiller),
                                    "--decode-events", kv_events(d), "--pd-policy", "always-remote"],
                   f"http://127.0.0.1:{proxy_port}")
    proxy.wait_healthy(60)
    hog = subprocess.Popen(["taskset", "-c", CORE, sys.executable, "-c", "while True: pass"])
    try:
        yield prefiller, d, proxy
    finally:
        hog.kill()
        hog.wait(10)
    for proc in (d, proxy):  # the next layout needs the cores
        proc.stop()


def test_every_load_succeeds_on_a_shared_busy_core_and_p_frees_its_blocks(shared_core):
    p, d, proxy = shared_core
    answers: list[dict] = []

    def one(salt: int) -> None:
        answers.append(complete(proxy.url, text_of(300, salt), max_tokens=8))

    burst = [threading.Thread(target=one, args=(900 + i,)) for i in range(4)]
    for t in burst:
        t.start()
    for t in burst:
        t.join(300)
    for salt in range(910, 914):
        one(salt)
    done = time.monotonic()
    assert len(answers) == 8 and all(a["choices"][0]["text"] for a in answers)
    m = scrape_metrics(d.url)
    assert metric_sum(m, "vllm:hybrid_pd_failed_transfers_total") == 0
    assert metric_sum(m, "vllm:hybrid_pd_xfer_time_seconds_count") == 8  # every turn's KV came from P
    log = d.log_path.read_text()
    assert "no handshake" not in log and log.count("failed=False") == 8
    # D told P Done: P frees its blocks. On a core shared with a spinner P's next step can wait a second or more
    # (1.008 s seen once), so the bound is what tells Done from the lease: far under the 120 s lease P would
    # otherwise hold them for
    while metric_sum(scrape_metrics(p.url), "vllm:kv_cache_usage_perc") > 0:
        assert time.monotonic() - done < 10.0, "P still holds blocks 10 s after the last answer (lease: 120 s)"
        time.sleep(0.05)


def test_the_decoder_launcher_warns_that_it_shares_the_prefillers_core(shared_core):
    p, d, _ = shared_core
    log = d.log_path.read_text()
    d_cores = d.argv[d.argv.index("--cpu-bind") + 1]
    assert f"--cpu-bind {d_cores} shares cores with the prefill worker pid {p.pid} (--cpu-bind {CORE})" in log
    assert "shares cores" not in p.log_path.read_text()  # P started alone
