"""--early-decode on real engines (proxy/pd_flow.py, connector/awaiting.py, connector/params_inbox.py): the decoder
gets each PD turn's request while the prefiller computes, waits for P's params in its params inbox (P pushes them
there itself: connector/direct_delivery.py), then reads P's blocks as in the sequential flow, and answers as one
engine does. A prefiller that answers an error or drops the
call while the decoder waits: the decoder computes the prompt itself, the client gets that one answer, the failed
remote load is counted and the decoder holds no block afterwards. An inbox the proxy cannot reach: the early
request is withdrawn and the turn goes to the decoder in turn, long before the decoder's bound.

Opt-in (engines: ~40 s each; REF and P are other modules' too, from the session's pool): runs with `-m engines`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import aiohttp
import pytest

from hybrid_pd.proxy.app import serve_in_background
from hybrid_pd.proxy.config import ProxyConfig
from tests.proxy.fakes import FakeWorker, metric_value, run
from tests.support.conversation import assert_same_greedy, greedy_reference, logprob_delta, note_noise_floor, text_of
from tests.support.engines import d_metrics, delta, pd_complete
from tests.support.procs import free_port, http_json

pytestmark = pytest.mark.engines

INBOX_PORT = free_port()
PROMPTS = {n: text_of(n, 60_000 + n) for n in (20, 300, 700)}
FAILED = {"error": text_of(400, 61_400), "dropped": text_of(500, 61_500)}
UNDELIVERED = text_of(450, 61_450)


@pytest.fixture(scope="module")
def engines(engine_set, tiny_model):
    return engine_set({
        "ref": ("decode", "none", "1", tiny_model, {}),
        "p": ("prefill", "hybrid", "0", tiny_model, {"HYBRID_PD_LEASE_S": "10"}),
        "d": ("decode", "hybrid", "1", tiny_model, {"HYBRID_PD_PARAMS_PORT": str(INBOX_PORT)}),
        "up": ("prefill", "upstream", "0", tiny_model),  # upstream's PD on the same prompts: the floor below
        "ud": ("decode", "upstream", "1", tiny_model),
    })


@pytest.fixture(scope="module")
def reference(engines):
    ref = engines.up("ref")["ref"]
    prompts = {**PROMPTS, **FAILED, "undelivered": UNDELIVERED}
    refs = {k: greedy_reference(ref, prompt) for k, prompt in prompts.items()}
    # upstream's NixlConnector splits these prompts between P and D as ours does: what that split alone moves here
    # (the 20-word prompt's last position: 0.079 nats on the EPYC bed, both connectors alike)
    urls = engines.up("up", "ud")
    spread = max(logprob_delta(refs[n], pd_complete(urls["up"], urls["ud"], PROMPTS[n], logprobs=1)[1])
                 for n in PROMPTS)
    note_noise_floor("upstream NixlConnector PD, the early-decode prompts", spread)
    return refs


@contextlib.asynccontextmanager
async def early_proxy(prefill_url: str, decode_url: str, inbox_port: int = INBOX_PORT, prefill_timeout: float = 20):
    config = ProxyConfig.from_flat({
        "port": 0, "prefill": [prefill_url], "decode": [decode_url], "decode_inbox": [f"tcp://127.0.0.1:{inbox_port}"],
        "early_decode": True, "pd_policy": "always-remote", "prefill_timeout": prefill_timeout, "health_interval": 0,
        "load_interval": 0})
    async with serve_in_background(config) as proxy, aiohttp.ClientSession() as session:
        yield proxy, session


async def via_proxy(proxy, session, prompt: str) -> dict:
    req = {"model": "tiny", "prompt": prompt, "max_tokens": 12, "temperature": 0.0, "ignore_eos": True,
           "logprobs": 2}
    async with session.post(proxy.url + "/v1/completions", json=req) as r:
        assert r.status == 200, await r.text()
        return await r.json()


def wait_until_d_holds_no_block(d_url: str) -> None:
    deadline = time.monotonic() + 10
    while d_metrics(d_url)["kv_cache_usage_perc"] > 0:
        assert time.monotonic() < deadline, "the decoder still holds blocks"
        time.sleep(0.2)


def test_pd_turns_sent_early_answer_as_one_engine_and_read_p_once_each(engines, reference):
    urls = engines.up("p", "d")
    before = d_metrics(urls["d"])

    async def body():
        async with early_proxy(urls["p"], urls["d"]) as (proxy, session):
            for n, prompt in PROMPTS.items():
                assert_same_greedy(reference[n], await via_proxy(proxy, session, prompt), f"early decode, {n} words")
            m = proxy.state.metrics.render().decode()
            assert metric_value(m, "hybrid_pd_proxy_requests_total", mode="remote_prefill", status="200") == 3
            # P pushed its params to D's inbox itself, each turn (connector/direct_delivery.py): none by the proxy
            assert metric_value(m, "hybrid_pd_proxy_early_deliveries_total", by="prefiller") == 3
            assert metric_value(m, "hybrid_pd_proxy_early_deliveries_total", by="proxy") == 0
    run(body(), timeout=240)
    moved = delta(before, d_metrics(urls["d"]))
    assert moved["hybrid_pd_bytes_transferred_count"] == 3 and moved["hybrid_pd_failed_transfers_total"] == 0
    wait_until_d_holds_no_block(urls["d"])


CHAT = [{"role": "system", "content": text_of(300, 62_300)}, {"role": "user", "content": text_of(40, 62_040)}]


def test_a_chat_turn_sent_early_is_templated_on_the_decoder_while_p_computes_and_reads_p(engines):
    """The chat endpoint: D applies the chat template to the request it got early; P's blocks are of the same
    templated prompt (one read, no failure), and the answer is one engine's."""
    urls = engines.up("ref", "p", "d")
    body = {"model": "tiny", "messages": CHAT, "max_tokens": 8, "temperature": 0.0, "ignore_eos": True}
    alone = http_json(urls["ref"] + "/v1/chat/completions", body)["choices"][0]["message"]["content"]
    before = d_metrics(urls["d"])

    async def via_early_proxy() -> str:
        async with (early_proxy(urls["p"], urls["d"]) as (proxy, session),
                    session.post(proxy.url + "/v1/chat/completions", json=body) as r):
            assert r.status == 200, await r.text()
            return (await r.json())["choices"][0]["message"]["content"]
    assert run(via_early_proxy(), timeout=120) == alone
    moved = delta(before, d_metrics(urls["d"]))
    assert moved["hybrid_pd_bytes_transferred_count"] == 1 and moved["hybrid_pd_failed_transfers_total"] == 0


@contextlib.asynccontextmanager
async def dropping_prefiller():
    """A prefiller that takes the call, then its connection drops before it answers (killed mid-prefill)."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(65536)
        await asyncio.sleep(1.5)
        writer.transport.abort()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()


@pytest.mark.parametrize("failure", sorted(FAILED))
def test_a_prefiller_failing_while_the_decoder_waits_leaves_the_decoder_to_compute_one_answer(
        engines, reference, failure):
    urls = engines.up("d")
    before = d_metrics(urls["d"])

    async def body():
        async with contextlib.AsyncExitStack() as stack:
            if failure == "error":
                p = FakeWorker("prefill", status=500, hang=True)
                prefill_url = await p.start()
                stack.push_async_callback(p.stop)
                asyncio.get_running_loop().call_later(1.5, p.release.set)  # D waits meanwhile
            else:
                prefill_url = await stack.enter_async_context(dropping_prefiller())
            proxy, session = await stack.enter_async_context(early_proxy(prefill_url, urls["d"]))
            began = time.monotonic()
            assert_same_greedy(reference[failure], await via_proxy(proxy, session, FAILED[failure]),
                               f"early decode, P {failure}")
            assert time.monotonic() - began >= 1.5  # D answered after P failed, not before
            reason = {"error": "prefill_5xx", "dropped": "prefill_unavailable"}[failure]
            m = proxy.state.metrics.render().decode()
            assert metric_value(m, "hybrid_pd_proxy_fallbacks_total", reason=reason) == 1
            assert metric_value(m, "hybrid_pd_proxy_requests_total", mode="fallback", status="200") == 1
    run(body(), timeout=120)
    moved = delta(before, d_metrics(urls["d"]))
    assert moved["hybrid_pd_failed_transfers_total"] == 1 and moved["hybrid_pd_bytes_transferred_count"] == 1
    wait_until_d_holds_no_block(urls["d"])


def test_an_inbox_the_proxy_cannot_reach_costs_the_turn_no_wait_and_p_is_read_in_turn(engines, reference):
    """The proxy is told a port nobody listens on for D's inbox: P's params cannot be delivered, and D would wait
    out its bound (the prefill timeout + 5 s: 65 s here) before computing the prompt. The proxy withdraws D's early
    request (vLLM aborts it) and sends the turn again with P's params: one engine's answer, long before the bound;
    D reads P once and holds no block afterwards."""
    urls = engines.up("p", "d")
    before = d_metrics(urls["d"])

    async def body():
        async with early_proxy(urls["p"], urls["d"], inbox_port=free_port(), prefill_timeout=60) as (proxy, session):
            began = time.monotonic()
            answer = await via_proxy(proxy, session, UNDELIVERED)
            took = time.monotonic() - began
            assert_same_greedy(reference["undelivered"], answer, "early decode, outcome not delivered")
            assert took < 15, f"{took:.1f} s: the decoder waited out its bound"
            m = proxy.state.metrics.render().decode()
            assert metric_value(m, "hybrid_pd_proxy_errors_total", kind="early_undelivered") == 1
            assert metric_value(m, "hybrid_pd_proxy_requests_total", mode="remote_prefill", status="200") == 1
            return took
    took = run(body(), timeout=120)
    print(f"undelivered turn answered in {took:.2f} s (bound 65 s)")
    moved = delta(before, d_metrics(urls["d"]))
    assert moved["hybrid_pd_bytes_transferred_count"] == 1 and moved["hybrid_pd_failed_transfers_total"] == 0
    wait_until_d_holds_no_block(urls["d"])
