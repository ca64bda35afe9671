"""A crashed prefill or decode worker rejoins with its own command, without touching anything else.

Real engines (our connector), our proxy and launchers on 127.0.0.1. The prefiller is SIGKILLed with its whole
process group (launcher, vLLM and its engine core, as a node failure would), the proxy serves decode-only
meanwhile, then the very same `hybrid-pd prefill ...` command is run again: it must start (the proxy still
holds the KV-event port it bound), its KV events must reach the proxy, the proxy must send it remote prefills
again, and the decoder must handshake the new engine on the same host:port and answer as it answers alone.
"""

from __future__ import annotations

import json
import signal
import time
import urllib.error
import urllib.request
from types import SimpleNamespace

import psutil
import pytest

from hybrid_pd.prefill.supervisor import health_ok
from tests.support.conversation import complete, text_of
from tests.support.engines import d_metrics, delta
from tests.support.procs import HYBRID_PD, free_port, metric_sum, scrape_metrics

pytestmark = pytest.mark.engines


def worker_cmd(role: str, model: str, port: int, side: int, events: int, core: str) -> list[str]:
    return [HYBRID_PD, role, "--connector", "hybrid", "--model", model, "--port", str(port), "--cpu-bind", core,
            "--side-channel-port", str(side), "--kv-events-port", str(events), "--kv-cache-gib", "1",
            "--max-model-len", "2048", "--max-num-batched-tokens", "2048", "--max-num-seqs", "4",
            "--served-model-name", "tiny"]


def proxy_counts(url: str, worker_url: str) -> dict[str, float]:
    m = scrape_metrics(url)
    return {"remote": metric_sum(m, 'hybrid_pd_proxy_disagg_decisions_total{decision="remote"}'),
            "fallbacks": metric_sum(m, "hybrid_pd_proxy_fallbacks_total"),
            "events": metric_sum(m, f'hybrid_pd_proxy_kv_event_batches_total{{worker="{worker_url}"}}')}


def kill_group(proc) -> None:
    for p in [*proc.descendants(), psutil.Process(proc.pid)]:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    proc.stop()


@pytest.fixture(scope="module")
def cluster(launch, tiny_model):
    """P, D and the proxy, each started by its own command (kept, to start it again)."""
    port = {k: free_port() for k in ("p", "d", "proxy", "p_side", "d_side", "p_events", "d_events")}
    c = SimpleNamespace(launch=launch, urls={k: f"http://127.0.0.1:{port[k]}" for k in ("p", "d", "proxy")})
    c.cmds = {"p": worker_cmd("prefill", tiny_model, port["p"], port["p_side"], port["p_events"], "0"),
              "d": worker_cmd("decode", tiny_model, port["d"], port["d_side"], port["d_events"], "1")}
    c.envs = {"p": {"HYBRID_PD_LEASE_S": "10"}, "d": {}}
    c.procs = {k: launch(k, c.cmds[k], c.urls[k], c.envs[k]) for k in ("p", "d")}
    for proc in c.procs.values():
        proc.wait_healthy(300)
    proxy = launch("proxy", [HYBRID_PD, "proxy", "--port", str(port["proxy"]), "--prefill", c.urls["p"],
                             "--decode", c.urls["d"], "--prefill-events", f"tcp://127.0.0.1:{port['p_events']}",
                             "--decode-events", f"tcp://127.0.0.1:{port['d_events']}", "--health-interval", "1"],
                   c.urls["proxy"])
    proxy.wait_healthy(60)
    return c


def pd_turn(c, salt: int) -> str:
    """A fresh prompt through the proxy; its answer must be the decoder's own answer to it."""
    text = complete(c.urls["proxy"], text_of(400, salt))["choices"][0]["text"]
    assert text == complete(c.urls["d"], text_of(400, salt))["choices"][0]["text"]
    return text


def restart(c, name: str, attempt: str) -> None:
    kill_group(c.procs[name])
    c.procs[name] = c.launch(f"{name}-{attempt}", c.cmds[name], c.urls[name], c.envs[name])


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


def test_a_prefiller_killed_and_restarted_with_its_own_command_serves_pd_again(cluster):
    c = cluster
    pd_turn(c, 1)
    before = proxy_counts(c.urls["proxy"], c.urls["p"])
    assert before["remote"] >= 1 and before["fallbacks"] == 0 and before["events"] > 0

    restart(c, "p", "again")
    pd_turn(c, 2)  # served while P is down: decode-only, never an error
    c.procs["p"].wait_healthy(300)  # the same command starts (the proxy holds the KV-event port it bound)
    after, moved = until_pd_again(c, "p", 100)
    # D handshook the new engine on the same host:port and read from it
    assert moved["hybrid_pd_bytes_transferred_count"] == 1 and moved["hybrid_pd_failed_transfers_total"] == 0
    assert after["events"] > before["events"]  # the new engine's KV events reach the proxy


def test_a_decoder_killed_and_restarted_with_its_own_command_serves_pd_again(cluster):
    c = cluster
    before = proxy_counts(c.urls["proxy"], c.urls["d"])
    restart(c, "d", "again")
    start = time.monotonic()  # no decoder: a clear OpenAI-shaped 5xx at once, never a hang
    req = urllib.request.Request(c.urls["proxy"] + "/v1/completions", headers={"Content-Type": "application/json"},
                                 data=json.dumps({"model": "tiny", "prompt": "hello", "max_tokens": 2}).encode())
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=60)
    assert err.value.code in (502, 503, 504) and time.monotonic() - start < 30
    assert set(json.loads(err.value.read())["error"]) == {"message", "type", "param", "code"}
    c.procs["d"].wait_healthy(300)
    deadline = time.monotonic() + 60
    while not health_ok(c.urls["proxy"]):  # the proxy re-admits the decoder after its health checks
        assert time.monotonic() < deadline, "the proxy never re-admitted the restarted decoder"
        time.sleep(0.5)
    after, moved = until_pd_again(c, "d", 200)
    assert moved["hybrid_pd_bytes_transferred_count"] == 1 and moved["hybrid_pd_failed_transfers_total"] == 0
    assert after["events"] > before["events"]  # the new decoder's KV events reach the proxy
