"""--early-decode against fake workers (proxy/pd_flow.py, proxy/params_outbox.py): D's request goes out with P's,
carrying a transfer key; P's outcome reaches D's params inbox (a real one, connector/params_inbox.py); the client
gets D's one answer whatever P did."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import aiohttp

from hybrid_pd.connector.contract import AWAIT_PREFILL, AWAIT_S
from hybrid_pd.connector.params_inbox import ParamsInbox
from tests.proxy.fakes import Cluster, cluster, metric_value, run
from tests.support.procs import free_port


@contextlib.asynccontextmanager
async def early_cluster(with_inbox: bool = True, proxy_inbox: str | None = None, **options) -> AsyncIterator[Cluster]:
    """One P, one D with a real params inbox (the proxy told `proxy_inbox` instead, where given)."""
    inbox = ParamsInbox("127.0.0.1", free_port())
    try:
        inboxes = {"decode_inbox": [proxy_inbox or inbox.address]} if with_inbox else {}
        async with cluster(early_decode=True, prefill_timeout=30, **inboxes, **options) as c:
            c.d.inbox = inbox
            yield c
    finally:
        inbox.close()


async def stream(url: str, body: dict) -> tuple[int, str]:
    async with aiohttp.ClientSession() as s, s.post(url + "/v1/completions", json=body) as r:
        text = await r.text()
    pieces = [json.loads(ln[6:]) for ln in text.splitlines() if ln.startswith("data: {")]
    return r.status, "".join(p["choices"][0]["text"] for p in pieces if p["choices"])


REQ = {"model": "m", "prompt": "hello world!", "max_tokens": 5, "stream": True,
       "stream_options": {"include_usage": True}}


def test_the_decoder_gets_the_request_while_the_prefiller_computes_then_p_params_in_its_inbox():
    async def body():
        async with early_cluster() as c:
            c.p.hang = True  # P answers only once D holds the request: they run at once
            answer = asyncio.ensure_future(stream(c.url, REQ))
            await asyncio.wait_for(c.d.received.wait(), 5)
            assert not c.p.finished.is_set()
            c.p.release.set()
            assert await answer == (200, "Hello")
            [d_call], [p_call] = c.d.generate_calls, c.p.generate_calls
            key = d_call.body["kv_transfer_params"][AWAIT_PREFILL]
            assert d_call.body["kv_transfer_params"] == {AWAIT_PREFILL: key, AWAIT_S: 35.0}
            assert p_call.headers["X-Request-Id"] == d_call.headers["X-Request-Id"]
            outcome = c.d.outcomes[key]
            assert outcome.params["remote_engine_id"] == f"engine-{c.p.url}" and outcome.reason == ""
            m = c.state.metrics.render().decode()
            assert metric_value(m, "hybrid_pd_proxy_requests_total", mode="remote_prefill", status="200") == 1
    run(body())


def test_two_turns_under_one_client_request_id_wait_under_keys_of_their_own():
    """A client may send one X-Request-Id twice at once: each turn's P params must reach its own D request."""
    async def body():
        async with early_cluster() as c:
            c.p.hang = True
            async with aiohttp.ClientSession() as s:
                async def one(prompt: str) -> int:
                    req = {"model": "m", "prompt": prompt, "max_tokens": 5}
                    async with s.post(c.url + "/v1/completions", json=req, headers={"X-Request-Id": "same"}) as r:
                        return r.status
                both = asyncio.gather(one("first prompt"), one("second prompt"))
                while len(c.d.generate_calls) < 2:
                    await asyncio.sleep(0.01)
                c.p.release.set()
                assert await both == [200, 200]
            keys = {d.body["kv_transfer_params"][AWAIT_PREFILL] for d in c.d.generate_calls}
            assert len(keys) == 2 and keys == set(c.d.outcomes)
    run(body())


def test_a_prefiller_that_fails_tells_the_decoder_to_compute_and_the_client_gets_one_answer():
    async def body():
        async with early_cluster() as c:
            c.p.status = 503
            assert await stream(c.url, REQ) == (200, "Hello")
            [d_call] = c.d.generate_calls
            outcome = c.d.outcomes[d_call.body["kv_transfer_params"][AWAIT_PREFILL]]
            assert outcome.params is None and outcome.reason
            m = c.state.metrics.render().decode()
            assert metric_value(m, "hybrid_pd_proxy_fallbacks_total", reason="prefill_5xx") == 1
            assert metric_value(m, "hybrid_pd_proxy_requests_total", mode="fallback", status="200") == 1
    run(body())


def test_a_prefillers_4xx_goes_to_the_decoder_which_answers_for_itself():
    async def body():
        async with early_cluster() as c:
            c.p.status = 400
            assert await stream(c.url, REQ) == (200, "Hello")
            outcome = c.d.outcomes[c.d.generate_calls[0].body["kv_transfer_params"][AWAIT_PREFILL]]
            assert outcome.params is None and "400" in outcome.reason
    run(body())


def test_a_decoder_without_an_inbox_is_served_in_turn():
    async def body():
        async with early_cluster(with_inbox=False) as c:
            assert await stream(c.url, REQ) == (200, "Hello")
            [d_call] = c.d.generate_calls
            assert d_call.body["kv_transfer_params"]["remote_engine_id"] == f"engine-{c.p.url}"
            assert c.d.outcomes == {}
    run(body())


def test_a_decoder_that_cannot_be_reached_leaves_the_turn_to_another_in_turn_with_p_params():
    """Its inbox gone with it: nothing is delivered there, and P's params go with the request to the other."""
    async def body():
        boxes = [ParamsInbox("127.0.0.1", free_port()) for _ in range(2)]
        try:
            async with cluster(n_decode=2, early_decode=True, decode_inbox=[b.address for b in boxes]) as c:
                gone = c.decode[0]
                await gone.stop()
                boxes[0].close()
                for _ in range(2):  # the round robin picks the stopped one first once
                    assert await stream(c.url, REQ) == (200, "Hello")
                sent = [s.body["kv_transfer_params"] for s in c.decode[1].generate_calls]
                after = [p for p in sent if AWAIT_PREFILL not in p]  # the retried turn: P's params, in turn
                assert len(after) == 1 and after[0]["remote_engine_id"] == f"engine-{c.p.url}"
                m = c.state.metrics.render().decode()
                assert metric_value(m, "hybrid_pd_proxy_errors_total", kind="early_undelivered") == 0
        finally:
            for box in boxes:
                box.close()
    run(body())


def test_an_outcome_that_cannot_be_delivered_withdraws_the_early_request_and_sends_p_params_in_turn():
    """The proxy cannot reach D's inbox (told a port nobody listens on): D would wait out its bound (5 s in the
    fake, 35 s here). The proxy closes D's early request and sends the turn again, with P's params: one answer."""
    async def body():
        async with early_cluster(proxy_inbox=f"tcp://127.0.0.1:{free_port()}") as c:
            began = asyncio.get_running_loop().time()
            assert await stream(c.url, REQ) == (200, "Hello")
            assert asyncio.get_running_loop().time() - began < 3
            early, in_turn = (call.body["kv_transfer_params"] for call in c.d.generate_calls)
            assert AWAIT_PREFILL in early and in_turn["remote_engine_id"] == f"engine-{c.p.url}"
            await asyncio.wait_for(c.d.client_gone.wait(), 5)  # the early request's connection was closed
            assert c.d.outcomes == {}
            m = c.state.metrics.render().decode()
            assert metric_value(m, "hybrid_pd_proxy_errors_total", kind="early_undelivered") == 1
            assert metric_value(m, "hybrid_pd_proxy_requests_total", mode="remote_prefill", status="200") == 1
    run(body())


def test_an_undelivered_failure_of_p_sends_the_turn_to_d_alone():
    async def body():
        async with early_cluster(proxy_inbox=f"tcp://127.0.0.1:{free_port()}") as c:
            c.p.status = 503
            began = asyncio.get_running_loop().time()
            assert await stream(c.url, REQ) == (200, "Hello")
            assert asyncio.get_running_loop().time() - began < 3
            early, in_turn = (call.body.get("kv_transfer_params") for call in c.d.generate_calls)
            assert AWAIT_PREFILL in early and in_turn is None
            m = c.state.metrics.render().decode()
            assert metric_value(m, "hybrid_pd_proxy_fallbacks_total", reason="prefill_5xx") == 1
            assert metric_value(m, "hybrid_pd_proxy_requests_total", mode="fallback", status="200") == 1
    run(body())
