"""Chaos: crashed workers rejoin with their own command under a storm of clients, and nothing is left behind.

Real engines (our connector), our proxy and launchers on 127.0.0.1, each started by its own command. While a
storm of clients runs (completions, streams, clients that hang up before the answer or mid-stream, malformed
bodies: tests/support/storm.py), the prefiller is SIGKILLed with its whole process group (launcher, vLLM and its
engine core, as a node failure would) between computing a prompt and the decoder's READ of it, then started
again with the very same command; later the decoder is. Every client must get 200, a 400 for its own fault, or
an OpenAI-shaped 502/503/504, within the proxy's deadline; PD must resume with the restarted worker (the decoder
handshakes the new engine on the same host:port, its KV events reach the proxy); and afterwards P's and D's
KV-cache usage (vLLM's gauge) must be back at its idle value: no leaked block.

Deadlines are the launchers' defaults (READ 30 s) except P's lease on blocks no decoder read, 10 s here instead
of 120 s, so that the leak check need not wait two minutes for the blocks of clients that hung up mid-prefill.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlsplit

import psutil
import pytest

from hybrid_pd.prefill.launch.supervisor import health_ok
from tests.support.conversation import assert_same_greedy, complete, greedy_reference, text_of
from tests.support.engines import d_metrics, delta
from tests.support.procs import HYBRID_PD, free_port, metric_sum, scrape_metrics
from tests.support.storm import PROXY_FAULTS, Storm, summary

pytestmark = pytest.mark.engines

DEADLINE_S = 60.0  # the proxy's --total-timeout here
LEASE_S = 10.0
STORM_S = 20.0
MAX_REQUESTS = 6000  # a bound: a storm normally ends by time (each test stops its own)


def worker_cmd(role: str, model: str, port: int, side: int, events: int, core: str) -> list[str]:
    return [HYBRID_PD, role, "--connector", "hybrid", "--model", model, "--port", str(port), "--cpu-bind", core,
            "--side-channel-port", str(side), "--kv-events-port", str(events), "--kv-cache-gib", "1",
            "--max-model-len", "2048", "--max-num-batched-tokens", "2048", "--max-num-seqs", "4",
            "--served-model-name", "tiny", "--warmup-lengths", "none",  # as deploy/k8s runs them, less the warm-up
            "--", "--shutdown-timeout", "30"]


def proxy_counts(url: str, worker_url: str) -> dict[str, float]:
    m = scrape_metrics(url)
    return {"remote": metric_sum(m, 'hybrid_pd_proxy_disagg_decisions_total{decision="remote"}'),
            "fallbacks": metric_sum(m, "hybrid_pd_proxy_fallbacks_total"),
            "events": metric_sum(m, f'hybrid_pd_proxy_kv_event_batches_total{{worker="{worker_url}"}}'),
            "in_flight": metric_sum(m, "hybrid_pd_proxy_in_flight")}


def kv_usage(url: str) -> float:
    return metric_sum(scrape_metrics(url), "vllm:kv_cache_usage_perc")


def cores_of_every_thread(proc) -> set[int]:
    """The union of the cores every thread of the launcher and of every process under it may run on."""
    cores: set[int] = set()
    for p in [psutil.Process(proc.pid), *proc.descendants()]:
        for task in Path(f"/proc/{p.pid}/task").iterdir():
            try:
                cores |= os.sched_getaffinity(int(task.name))
            except (ProcessLookupError, OSError):
                pass
    return cores


def kill_group(proc) -> None:
    """SIGKILL a launcher and everything under it, and wait until all of it is gone: a process that is still
    tearing down its memory holds its sockets, and a restart on the same ports would find them in use."""
    victims = [*proc.descendants(), psutil.Process(proc.pid)]
    for p in victims:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    proc.stop()
    _, alive = psutil.wait_procs(victims, timeout=60)
    assert not alive, f"still alive 60 s after SIGKILL: {alive}"


@pytest.fixture(scope="module")
def cluster(launch, tiny_model):
    """P, D and the proxy, each started by its own command (kept, to start it again)."""
    port = {k: free_port() for k in ("p", "d", "proxy", "p_side", "d_side", "p_events", "d_events")}
    c = SimpleNamespace(launch=launch, urls={k: f"http://127.0.0.1:{port[k]}" for k in ("p", "d", "proxy")})
    c.cmds = {"p": worker_cmd("prefill", tiny_model, port["p"], port["p_side"], port["p_events"], "0"),
              "d": worker_cmd("decode", tiny_model, port["d"], port["d_side"], port["d_events"], "1")}
    c.envs = {"p": {"HYBRID_PD_LEASE_S": str(LEASE_S)}, "d": {}}
    c.procs = {k: launch(k, c.cmds[k], c.urls[k], c.envs[k]) for k in ("p", "d")}
    for proc in c.procs.values():
        proc.wait_healthy(300)
    proxy = launch("proxy", [HYBRID_PD, "proxy", "--port", str(port["proxy"]), "--prefill", c.urls["p"],
                             "--decode", c.urls["d"], "--prefill-events", f"tcp://127.0.0.1:{port['p_events']}",
                             "--decode-events", f"tcp://127.0.0.1:{port['d_events']}", "--health-interval", "1",
                             "--total-timeout", str(DEADLINE_S), "--pd-policy", "always-remote"],  # PD turns
                   c.urls["proxy"])
    proxy.wait_healthy(60)
    c.idle = {k: kv_usage(c.urls[k]) for k in ("p", "d")}
    assert c.idle == {"p": 0.0, "d": 0.0}  # fresh engines hold no block: the baseline of assert_back_to_idle
    return c


def pd_turn(c, salt: int) -> None:
    """A fresh prompt through the proxy; its answer must be one engine's that received no KV (the prefiller,
    asked before the PD turn: afterwards the decoder holds the blocks under test and would repeat them)."""
    prompt = text_of(400, salt)
    reference = greedy_reference(c.urls["p"], prompt)
    assert_same_greedy(reference, complete(c.urls["proxy"], prompt, logprobs=1), f"chaos: PD turn {salt}")


def restart(c, name: str, attempt: str, tries: int = 5) -> None:
    """Run the worker's own command again, as a restart policy would: a start the launcher refused (exit 2, e.g.
    a port the dead worker's processes still held) is run again 3 s later."""
    for i in range(tries):
        proc = c.procs[name] = c.launch(f"{name}-{attempt}-{i}", c.cmds[name], c.urls[name], c.envs[name])
        deadline = time.monotonic() + 60
        while proc.proc.poll() is None and "starting" not in proc.log_path.read_text():
            assert time.monotonic() < deadline, f"{name}'s launcher neither started vLLM nor refused"
            time.sleep(0.2)
        if proc.proc.poll() != 2:
            return
        print(f"{name}: start {i + 1} refused: {proc.log_path.read_text().strip()[-200:]}")
        time.sleep(3)
    raise AssertionError(f"{name} refused to start {tries} times")


def until_pd_again(c, worker: str, salt: int) -> tuple[dict, dict]:
    """PD turns until the proxy sends one to P again (it re-admits a worker after its health checks)."""
    deadline = time.monotonic() + 60
    while True:
        at, d_at = proxy_counts(c.urls["proxy"], c.urls[worker]), d_metrics(c.urls["d"])
        pd_turn(c, salt)
        after, moved = proxy_counts(c.urls["proxy"], c.urls[worker]), delta(d_at, d_metrics(c.urls["d"]))
        if after["remote"] > at["remote"] and after["fallbacks"] == at["fallbacks"]:
            return after, moved
        assert time.monotonic() < deadline, f"the restarted {worker} never served a PD turn again: {after}"
        salt += 1
        time.sleep(1)


def assert_storm_served(storm: Storm, faults_allowed: bool, served_share: float = 0.25) -> dict:
    """Every client got its answer or a clear error within the deadline, and at least `served_share` of them
    got a 200; no stream was cut by an SSE error event unless faults were injected (a worker killed
    mid-answer); returns the storm's summary."""
    outcomes = storm.stop()
    s = summary(outcomes)
    assert s["requests"] >= 10, s
    if not faults_allowed:
        assert s["cut_streams"] == 0, s
    assert not [o for o in outcomes if o.problem and not (faults_allowed and o.cut)], s
    statuses = {int(k) for k in s["by_status"] if k != "None"}
    assert statuses <= {200, 400, *(PROXY_FAULTS if faults_allowed else ())}, s
    assert s["by_status"].get("200", 0) >= served_share * s["requests"], s
    print("storm:", json.dumps({k: v for k, v in s.items() if k != "problems"}))
    return s


def assert_back_to_idle(c, timeout: float = LEASE_S + 30) -> None:
    """No leaked block: P's and D's KV-cache usage return to what they showed idle before the first storm (P
    frees blocks that no decoder read when their lease ends), and the proxy serves nothing."""
    deadline = time.monotonic() + timeout
    while True:
        now = {k: kv_usage(c.urls[k]) for k in ("p", "d")}
        in_flight = proxy_counts(c.urls["proxy"], c.urls["p"])["in_flight"]
        if all(now[k] <= c.idle[k] + 1e-9 for k in now) and in_flight == 0:
            return
        assert time.monotonic() < deadline, f"KV usage {now} (idle {c.idle}), proxy in flight {in_flight}"
        time.sleep(1)


def test_a_storm_of_clients_that_hang_up_at_random_points_leaves_nothing_behind(cluster):
    c = cluster
    storm = Storm(c.urls["proxy"], DEADLINE_S, seed=1, max_requests=MAX_REQUESTS).start()
    time.sleep(STORM_S)
    s = assert_storm_served(storm, faults_allowed=False)
    assert s["by_kind"].get("hangup_early", 0) and s["by_kind"].get("hangup_mid_stream", 0), s
    assert_back_to_idle(c)


def test_a_prefiller_killed_mid_transfer_rejoins_with_its_own_command(cluster):
    c = cluster
    pd_turn(c, 1)
    before = proxy_counts(c.urls["proxy"], c.urls["p"])
    assert before["remote"] >= 1 and before["events"] > 0
    storm = Storm(c.urls["proxy"], DEADLINE_S, seed=2, max_requests=MAX_REQUESTS).start()
    time.sleep(3)
    # P computed a prompt and holds its blocks for D; P dies before D reads them: D computes the prompt
    prompt = text_of(400, 7)
    reference = greedy_reference(c.urls["p"], prompt)  # before any KV of it moves (D would repeat bad blocks)
    p_resp = complete(c.urls["p"], prompt, max_tokens=1, kv_transfer_params={"do_remote_decode": True})
    kill_group(c.procs["p"])
    d_at, start = d_metrics(c.urls["d"]), time.monotonic()
    d_resp = complete(c.urls["d"], prompt, kv_transfer_params=p_resp["kv_transfer_params"], logprobs=1)
    took = time.monotonic() - start
    print(f"D's answer with its READ from the killed P: {took:.2f} s")
    assert took < DEADLINE_S  # no request outlives the deadline (usually 2-6 s: a dead peer fails at once)
    # this READ failed (and maybe those of storm requests that P was feeding when it died)
    assert delta(d_at, d_metrics(c.urls["d"]))["hybrid_pd_failed_transfers_total"] >= 1
    assert_same_greedy(reference, d_resp, "chaos: D after a failed load")

    restart(c, "p", "again")  # the same command (the proxy still holds the KV-event port it bound)
    c.procs["p"].wait_healthy(300)
    at_restart = proxy_counts(c.urls["proxy"], c.urls["p"])
    # pinned from its first instruction (the launcher pins itself): no `import torch` on the busy decoder's core
    assert cores_of_every_thread(c.procs["p"]) == {0}
    assert_storm_served(storm, faults_allowed=False)  # P down costs clients nothing: decode-only meanwhile
    after, moved = until_pd_again(c, "p", 100)
    # D handshook the new engine on the same host:port and read from it
    assert moved["hybrid_pd_bytes_transferred_count"] == 1 and moved["hybrid_pd_failed_transfers_total"] == 0
    assert after["events"] > at_restart["events"]  # the new engine's KV events reach the proxy
    assert_back_to_idle(c)


def test_a_decoder_killed_under_load_rejoins_with_its_own_command(cluster):
    c = cluster
    storm = Storm(c.urls["proxy"], DEADLINE_S, seed=3, max_requests=MAX_REQUESTS).start()
    time.sleep(3)
    kill_group(c.procs["d"])
    restart(c, "d", "again")
    start = time.monotonic()  # no decoder: a clear OpenAI-shaped 5xx at once, never a hang
    req = urllib.request.Request(c.urls["proxy"] + "/v1/completions", headers={"Content-Type": "application/json"},
                                 data=json.dumps({"model": "tiny", "prompt": "hello", "max_tokens": 2}).encode())
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=60)
    assert err.value.code in PROXY_FAULTS and time.monotonic() - start < 30
    assert set(json.loads(err.value.read())["error"]) == {"message", "type", "param", "code"}
    c.procs["d"].wait_healthy(300)
    at_restart = proxy_counts(c.urls["proxy"], c.urls["d"])
    deadline = time.monotonic() + 60
    while not health_ok(c.urls["proxy"]):  # the proxy re-admits the decoder after its health checks
        assert time.monotonic() < deadline, "the proxy never re-admitted the restarted decoder"
        time.sleep(0.5)
    s = assert_storm_served(storm, faults_allowed=True, served_share=0.02)  # mostly 503s while D was away
    after, moved = until_pd_again(c, "d", 200)
    assert any(int(k) in PROXY_FAULTS for k in s["by_status"] if k != "None"), s  # D was really gone meanwhile
    assert moved["hybrid_pd_bytes_transferred_count"] == 1 and moved["hybrid_pd_failed_transfers_total"] == 0
    assert after["events"] > at_restart["events"]  # the new decoder's KV events reach the proxy
    assert_back_to_idle(c)


def test_a_stream_in_flight_when_its_decoder_gets_sigterm_completes(cluster):
    """A rollout's SIGTERM reaches D's launcher, which forwards it to vLLM's process group: vLLM (with
    --shutdown-timeout, as the manifests give it) takes no new request and finishes the streams it serves."""
    c = cluster
    body = json.dumps({"model": "tiny", "prompt": text_of(200, 9), "max_tokens": 300, "ignore_eos": True,
                       "temperature": 0.0, "stream": True}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", urlsplit(c.urls["proxy"]).port, timeout=DEADLINE_S)
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    events, done = 0, False
    for line in resp:
        if not line.startswith(b"data: "):
            continue
        if line.strip() == b"data: [DONE]":
            done = True
            break
        assert b'"error"' not in line, line
        events += 1
        if events == 5:
            c.procs["d"].signal(signal.SIGTERM, group=False)  # the launcher only, as the kubelet does
    conn.close()
    assert done and events >= 300, (events, done)  # every token, then the end of the stream
    assert c.procs["d"].proc.wait(60) == 0  # and D stopped cleanly once it was served
