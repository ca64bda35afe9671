"""The PD flow against fake workers: what P and D receive, what the client gets back."""

from __future__ import annotations

import aiohttp

from hybrid_pd.proxy.openai_api import PREFILL_KV_TRANSFER_PARAMS
from tests.proxy.fakes import cluster, metric_value, run


async def post(url: str, path: str, body: dict, headers: dict | None = None) -> tuple[int, dict, str]:
    async with aiohttp.ClientSession() as s, s.post(url + path, json=body, headers=headers or {}) as r:
        return r.status, await r.json(content_type=None), r.content_type


async def sse(url: str, path: str, body: dict) -> tuple[int, str, list[str]]:
    async with aiohttp.ClientSession() as s, s.post(url + path, json=body) as r:
        text = await r.text()
        return r.status, r.content_type, [ln[6:] for ln in text.splitlines() if ln.startswith("data: ")]


def test_completion_pd_bodies_and_answer():
    async def body():
        async with cluster() as c:
            c.p.cached_tokens = 3
            c.d.cached_tokens = 11  # vLLM's D counts pulled tokens as its own hits
            req = {"model": "m", "prompt": "hello world!", "max_tokens": 5, "min_tokens": 2, "logprobs": 1,
                   "n": 1, "stream": False, "kv_transfer_params": {"evil": True}}
            status, out, _ = await post(c.url, "/v1/completions", req, {"Authorization": "Bearer k"})
            assert status == 200
            assert out["choices"][0]["text"] == "Hello"  # D's answer; P's token "P" is dropped
            assert "kv_transfer_params" not in out
            assert out["usage"]["prompt_tokens_details"]["cached_tokens"] == 3  # P's hit, not D's 11
            [p_call], [d_call] = c.p.generate_calls, c.d.generate_calls
            assert p_call.body == {"model": "m", "prompt": "hello world!", "max_tokens": 1, "stream": False,
                                   "kv_transfer_params": PREFILL_KV_TRANSFER_PARAMS}
            assert d_call.body["kv_transfer_params"]["remote_engine_id"] == f"engine-{c.p.url}"
            assert d_call.body["kv_transfer_params"]["remote_block_ids"] == [[1, 2], [0, 7]]
            assert {k: v for k, v in d_call.body.items() if k != "kv_transfer_params"} == {
                k: v for k, v in req.items() if k != "kv_transfer_params"}
            assert p_call.headers["X-Request-Id"] == d_call.headers["X-Request-Id"]
            assert d_call.headers["Authorization"] == "Bearer k"
            m = c.state.metrics.render().decode()
            assert metric_value(m, "hybrid_pd_proxy_requests_total", mode="remote_prefill", status="200") == 1
            assert metric_value(m, "hybrid_pd_proxy_disagg_decisions_total", decision="remote") == 1
    run(body())


def test_chat_stream_pd_with_usage():
    async def body():
        async with cluster() as c:
            c.p.cached_tokens = 2
            req = {"model": "m", "messages": [{"role": "user", "content": "hi there"}], "stream": True,
                   "stream_options": {"include_usage": True}, "max_completion_tokens": 9, "top_logprobs": 2,
                   "logprobs": True}
            status, ctype, events = await sse(c.url, "/v1/chat/completions", req)
            assert status == 200 and ctype == "text/event-stream"
            assert events[-1] == "[DONE]"
            import json
            chunks = [json.loads(e) for e in events[:-1]]
            assert "".join(ch["choices"][0]["delta"]["content"] for ch in chunks if ch["choices"]) == "Hello"
            assert chunks[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] == 2
            p_body = c.p.generate_calls[0].body
            assert p_body["stream"] is False and "stream_options" not in p_body
            assert p_body["max_tokens"] == 1 and p_body["max_completion_tokens"] == 1
            assert "logprobs" not in p_body and "top_logprobs" not in p_body
            d_body = c.d.generate_calls[0].body
            assert d_body["stream"] is True and d_body["stream_options"] == {"include_usage": True}
            assert d_body["max_completion_tokens"] == 9 and d_body["kv_transfer_params"]["remote_port"] == 5600
    run(body())


def test_stream_without_usage_request_has_no_usage_chunk():
    async def body():
        async with cluster() as c:
            _, _, events = await sse(c.url, "/v1/completions", {"prompt": "abc", "stream": True})
            assert events[-1] == "[DONE]" and all('"usage"' not in e for e in events)
    run(body())


def test_batch_prompt_and_n_are_decode_only():
    async def body():
        async with cluster() as c:
            for req in ({"prompt": ["a", "b"]}, {"prompt": "abc", "n": 2}):
                status, _, _ = await post(c.url, "/v1/completions", req)
                assert status == 200
            assert c.p.generate_calls == []
            assert all("kv_transfer_params" not in s.body for s in c.d.generate_calls)
            m = c.state.metrics.render().decode()
            assert metric_value(m, "hybrid_pd_proxy_disagg_decisions_total", decision="local_ineligible") == 2
    run(body())


def test_models_health_metrics():
    async def body():
        async with cluster() as c:
            async with aiohttp.ClientSession() as s:
                async with s.get(c.url + "/v1/models") as r:
                    assert r.status == 200 and (await r.json())["data"][0]["owned_by"] == "decode"
                async with s.get(c.url + "/health") as r:
                    assert r.status == 200 and (await r.json())["admitted"] == {"prefill": 1, "decode": 1}
                await post(c.url, "/v1/completions", {"prompt": "abc"})
                async with s.get(c.url + "/metrics") as r:
                    text = await r.text()
            for name in ("hybrid_pd_proxy_requests_total", "hybrid_pd_proxy_request_latency_seconds_bucket",
                         "hybrid_pd_proxy_stage_latency_seconds_bucket", "hybrid_pd_proxy_time_to_first_token_seconds",
                         "hybrid_pd_proxy_routing_decisions_total", "hybrid_pd_proxy_hit_tokens_total"):
                assert name in text, name
            assert metric_value(text, "hybrid_pd_proxy_stage_latency_seconds_count", stage="prefill") == 1
            assert metric_value(text, "hybrid_pd_proxy_stage_latency_seconds_count", stage="decode") == 1
    run(body())


def test_fields_only_the_decoder_judges_are_refused_before_the_prefiller_computes_anything():
    """P never sees output-only fields: a body D would refuse must not cost a prefill and a lease first."""
    bad = [("completions", {"prompt": "abc", "stream_options": {"include_usage": True}}, "stream_options"),
           ("completions", {"prompt": "abc", "min_tokens": 5, "max_tokens": 2}, "min_tokens"),
           ("completions", {"prompt": "abc", "min_tokens": -1}, "min_tokens"),
           ("completions", {"prompt": "abc", "n": 0}, "n"),
           ("completions", {"prompt": "abc", "n": 2, "best_of": 1}, "best_of"),
           ("completions", {"prompt": "abc", "logprobs": -1}, "logprobs"),
           ("chat", {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, "top_logprobs"),
           ("chat", {"messages": [{"role": "user", "content": "hi"}], "min_tokens": 9,
                     "max_completion_tokens": 3}, "min_tokens")]

    async def body():
        async with cluster() as c:
            for endpoint, req, param in bad:
                path = "/v1/completions" if endpoint == "completions" else "/v1/chat/completions"
                status, answer, _ = await post(c.url, path, req)
                assert status == 400 and answer["error"]["param"] == param, (req, answer)
            assert c.p.generate_calls == [] and c.d.generate_calls == []
            ok = {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 2,
                  "min_tokens": 1, "max_completion_tokens": 3, "stream": True, "stream_options": {}}
            status, _, _ = await sse(c.url, "/v1/chat/completions", ok)
            assert status == 200
    run(body())
