"""Every failure path of the PD flow against fake workers: fallbacks, pass-through, timeouts, disconnects,
overload. Each test waits on events, never on sleeps."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from tests.proxy.fakes import cluster, metric_value, run

REQ = {"model": "m", "prompt": "hello world", "max_tokens": 4}


async def post(url: str, path: str, body, raw: bytes | None = None) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as s:
        kw = {"data": raw, "headers": {"Content-Type": "application/json"}} if raw is not None else {"json": body}
        async with s.post(url + path, **kw) as r:
            return r.status, await r.json(content_type=None)


def assert_openai_error(body: dict) -> None:
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]


def metrics(c) -> str:
    return c.state.metrics.render().decode()


def test_prefill_5xx_falls_back_to_decode_only():
    async def body():
        async with cluster() as c:
            c.p.status = 503
            status, out = await post(c.url, "/v1/completions", REQ)
            assert status == 200 and out["choices"][0]["text"] == "Hello"
            assert "kv_transfer_params" not in c.d.generate_calls[0].body
            assert c.d.generate_calls[0].body["prompt"] == "hello world"
            assert metric_value(metrics(c), "hybrid_pd_proxy_fallbacks_total", reason="prefill_5xx") == 1
            assert metric_value(metrics(c), "hybrid_pd_proxy_requests_total", mode="fallback") == 1
    run(body())


def test_prefill_without_kv_transfer_params_falls_back():
    async def body():
        async with cluster() as c:
            c.p.return_ktp = False
            c.d.cached_tokens = 4
            status, out = await post(c.url, "/v1/completions", REQ)
            assert status == 200 and "kv_transfer_params" not in c.d.generate_calls[0].body
            assert out["usage"]["prompt_tokens_details"]["cached_tokens"] == 4  # decode-only: D's own figure
            assert metric_value(metrics(c), "hybrid_pd_proxy_fallbacks_total", reason="no_kv_transfer_params") == 1
    run(body())


def test_prefill_timeout_falls_back():
    async def body():
        async with cluster(prefill_timeout=0.2) as c:
            c.p.hang = True
            status, _ = await post(c.url, "/v1/completions", REQ)
            assert status == 200 and "kv_transfer_params" not in c.d.generate_calls[0].body
            assert metric_value(metrics(c), "hybrid_pd_proxy_fallbacks_total", reason="prefill_timeout") == 1
            await asyncio.wait_for(c.p.client_gone.wait(), 5)  # P's own timeout drops its call
            assert metric_value(metrics(c), "hybrid_pd_proxy_abandoned_prefills_total") == 0
            assert c.state.pool.all("prefill")[0].in_flight == 0
    run(body())


def test_prefill_unreachable_falls_back_and_is_ejected():
    async def body():
        async with cluster(health_interval=3600) as c:
            await c.p.stop()  # connection refused
            status, _ = await post(c.url, "/v1/completions", REQ)
            assert status == 200 and "kv_transfer_params" not in c.d.generate_calls[0].body
            assert metric_value(metrics(c), "hybrid_pd_proxy_fallbacks_total", reason="prefill_unavailable") == 1
            assert not c.state.pool.all("prefill")[0].healthy
            status, _ = await post(c.url, "/v1/completions", REQ)  # the ejected P is not tried again
            assert status == 200
            assert metric_value(metrics(c), "hybrid_pd_proxy_fallbacks_total", reason="no_prefill_worker") == 1
    run(body())


def test_prefill_4xx_is_passed_through():
    async def body():
        async with cluster() as c:
            c.p.status = 400
            c.p.error_body = {"error": {"message": "prompt too long", "type": "BadRequestError", "param": "prompt",
                                        "code": 400}}
            status, out = await post(c.url, "/v1/completions", REQ)
            assert status == 400
            assert out == {"error": {"message": "prompt too long", "type": "BadRequestError", "param": "prompt",
                                     "code": 400}}
            assert c.d.generate_calls == []
            assert metric_value(metrics(c), "hybrid_pd_proxy_errors_total", kind="upstream_4xx") == 1
    run(body())


def test_decode_errors_are_openai_shaped():
    async def body():
        async with cluster() as c:
            c.d.status, c.d.error_body = 422, {"detail": "unprocessable"}  # FastAPI's shape, not OpenAI's
            status, out = await post(c.url, "/v1/completions", REQ)
            assert status == 422
            assert_openai_error(out)
            assert out["error"]["message"] == "unprocessable"
            c.d.status, c.d.error_body = 500, None
            status, out = await post(c.url, "/v1/completions", REQ)
            assert status == 500
            assert_openai_error(out)
    run(body())


def test_decode_first_byte_timeout_is_504():
    async def body():
        async with cluster(decode_first_byte_timeout=0.2) as c:
            c.d.hang = True
            status, out = await post(c.url, "/v1/completions", dict(REQ, stream=True))
            assert status == 504
            assert_openai_error(out)
            assert out["error"]["type"] == "timeout"
            assert metric_value(metrics(c), "hybrid_pd_proxy_errors_total", kind="timeout") == 1
    run(body())


def test_total_timeout_mid_stream_ends_with_an_error_event():
    async def body():
        # 2 s: the first piece must come before the deadline on a loaded 2-core CI machine (0.5 s did not, once)
        async with cluster(total_timeout=2.0) as c:
            c.d.hang_stream_after_first = True
            async with aiohttp.ClientSession() as s, s.post(c.url + "/v1/completions",
                                                            json=dict(REQ, stream=True)) as r:
                assert r.status == 200
                text = await r.text()
            events = [ln[6:] for ln in text.splitlines() if ln.startswith("data: ")]
            assert json.loads(events[0])["choices"][0]["text"] == "Hel"
            assert json.loads(events[-1])["error"]["type"] == "timeout"
            await asyncio.wait_for(c.d.client_gone.wait(), 5)  # the decode leg was aborted
    run(body())


def test_client_disconnect_aborts_decode_leg():
    async def body():
        async with cluster() as c:
            c.d.hang_stream_after_first = True
            async with aiohttp.ClientSession() as s, s.post(c.url + "/v1/completions",
                                                            json=dict(REQ, stream=True)) as r:
                first = await r.content.readline()
                assert first.startswith(b"data: ")
            # leaving the block closes the client connection mid-stream
            await asyncio.wait_for(c.d.client_gone.wait(), 5)
    run(body())


def test_client_disconnect_during_prefill_lets_prefill_finish():
    async def body():
        async with cluster() as c:
            c.p.hang = True
            s = aiohttp.ClientSession()
            task = asyncio.create_task(s.post(c.url + "/v1/completions", json=REQ))
            await asyncio.wait_for(c.p.received.wait(), 5)
            task.cancel()
            await s.close()
            await asyncio.wait_for(_until(lambda: metric_value(
                metrics(c), "hybrid_pd_proxy_abandoned_prefills_total") == 1), 5)
            assert not c.p.client_gone.is_set()  # P's call was not cut
            prefiller = c.state.pool.all("prefill")[0]
            assert prefiller.in_flight == 1  # still busy while it runs on, for least-loaded routing
            c.p.release.set()
            await asyncio.wait_for(c.p.finished.wait(), 5)
            await asyncio.wait_for(_until(lambda: prefiller.in_flight == 0), 5)
            assert not c.p.client_gone.is_set()
            assert c.d.generate_calls == []  # nobody decodes for a gone client
    run(body())


def test_total_timeout_during_prefill_is_504_and_lets_prefill_finish():
    async def body():
        async with cluster(total_timeout=0.3) as c:
            c.p.hang = True
            status, out = await post(c.url, "/v1/completions", REQ)
            assert status == 504 and out["error"]["type"] == "timeout"
            assert metric_value(metrics(c), "hybrid_pd_proxy_abandoned_prefills_total") == 1
            prefiller = c.state.pool.all("prefill")[0]
            assert prefiller.in_flight == 1 and not c.p.client_gone.is_set()
            c.p.release.set()
            await asyncio.wait_for(c.p.finished.wait(), 5)
            await asyncio.wait_for(_until(lambda: prefiller.in_flight == 0), 5)
            assert not c.p.client_gone.is_set() and c.d.generate_calls == []
            assert c.state.upstream.pool.idle_count(c.p.url) == 1  # P's answer was read: its connection pooled
    run(body())


def test_client_disconnect_aborts_a_whole_json_decode():
    async def body():
        async with cluster() as c:
            c.d.hang = True
            s = aiohttp.ClientSession()
            task = asyncio.create_task(s.post(c.url + "/v1/chat/completions",
                                              json={"messages": [{"role": "user", "content": "hi"}]}))
            await asyncio.wait_for(c.d.received.wait(), 5)
            task.cancel()
            await s.close()
            await asyncio.wait_for(c.d.client_gone.wait(), 5)  # the proxy closed D's connection
            await asyncio.wait_for(_until(lambda: metric_value(
                metrics(c), "hybrid_pd_proxy_errors_total", kind="client_disconnect") == 1), 5)
            assert c.state.admission.active == 0 and c.state.pool.all("decode")[0].in_flight == 0
    run(body())


async def _until(cond) -> None:
    while not cond():
        await asyncio.sleep(0.01)


def test_queue_full_is_429_and_queue_wait_is_bounded():
    async def body():
        async with cluster(max_in_flight=1, max_queue=0) as c:
            c.d.hang = True
            async with aiohttp.ClientSession() as s:
                first = asyncio.create_task(s.post(c.url + "/v1/completions", json=REQ))
                await asyncio.wait_for(c.d.received.wait(), 5)
                status, out = await post(c.url, "/v1/completions", REQ)
                assert status == 429 and out["error"]["type"] == "rate_limit_error"
                c.d.release.set()
                r = await first
                assert r.status == 200
                r.release()
        async with cluster(max_in_flight=1, max_queue=1, queue_timeout=0.2) as c:
            c.d.hang = True
            async with aiohttp.ClientSession() as s:
                first = asyncio.create_task(s.post(c.url + "/v1/completions", json=REQ))
                await asyncio.wait_for(c.d.received.wait(), 5)
                status, out = await post(c.url, "/v1/completions", REQ)  # waits 0.2 s in the queue, then 429
                assert status == 429
                assert_openai_error(out)
                c.d.release.set()
                (await first).release()
    run(body())


def test_no_healthy_decoder_is_503():
    async def body():
        async with cluster() as c:
            for w in c.state.pool.all("decode"):
                c.state.pool.eject(w, "test")
            status, out = await post(c.url, "/v1/completions", REQ)
            assert status == 503 and out["error"]["code"] == "no_healthy_worker"
            async with aiohttp.ClientSession() as s, s.get(c.url + "/health") as r:
                assert r.status == 503
    run(body())


def test_decoder_unreachable_retries_another_decoder():
    async def body():
        async with cluster(n_decode=2, decode_policy="none", decode_picker="first", health_interval=3600) as c:
            await c.decode[0].stop()
            status, out = await post(c.url, "/v1/completions", REQ)
            assert status == 200 and len(c.decode[1].generate_calls) == 1
            assert "kv_transfer_params" in c.decode[1].generate_calls[0].body  # P's blocks still used
            assert not c.state.pool.all("decode")[0].healthy
    run(body())


def test_malformed_requests_are_400():
    async def body():
        async with cluster() as c:
            cases = [b"{not json", b"[1, 2]", b'"text"', b'{"prompt": 5}', b'{"prompt": "a", "stream": "yes"}',
                     b'{"messages": []}', b'{"prompt": "a", "max_tokens": "9"}', b'{"prompt": [1, "a"]}']
            for raw in cases:
                path = "/v1/chat/completions" if b"messages" in raw else "/v1/completions"
                status, out = await post(c.url, path, None, raw=raw)
                assert status == 400, raw
                assert_openai_error(out)
            async with aiohttp.ClientSession() as s:
                async with s.get(c.url + "/v1/nothing") as r:
                    assert r.status == 404
                    assert_openai_error(await r.json())
                async with s.get(c.url + "/v1/completions") as r:
                    assert r.status == 405 and r.headers["Allow"] == "POST"
                    assert_openai_error(await r.json())
            assert c.d.generate_calls == [] and c.p.generate_calls == []
    run(body())
