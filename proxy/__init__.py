"""OpenAI-compatible PD routing proxy (`hybrid-pd proxy`): decode-first, cache- and hybrid-aware.

server.py            main(argv): flags/env/file -> ProxyConfig, uvloop, SIGTERM/SIGINT (drain, then exit)
cli.py               the `hybrid-pd` command (prefill, decode, proxy, demo); demo.py, demo_workload.py: the demo
config/              the frozen, validated ProxyConfig (sections.py: its parts, one per component);
                     sources.py: CLI < env < JSON file
app.py               routes, the error boundary, serve_in_background(config); state.py: what requests share
http/                HTTP both ways: server.py (uvicorn's httptools protocol, limits, OpenAI-shaped 4xx) and
                     request.py (one request and the way a handler answers it, whole or streamed); client.py (the
                     lean keep-alive HTTP/1.1 client under upstream.py) and response.py (one worker's answer)
pd_flow.py           one request: tokenize -> decoder -> remote prefill or not -> decode, fallbacks (turn.py:
                     what a request carries between the steps)
openai_api.py        request parsing/type checks (request_fields.py: the field rules); the prefill and decode bodies
relay.py / usage.py  copy D's JSON or SSE to the client; the whole-request cached_tokens rule
upstream.py          calls to workers; the HTTP client's and asyncio's errors -> errors.py at this one boundary
routing/             scorer and picker plugins by name, composed per role by config; none imports another
kv/                  events.py: vLLM KV events on the wire; subscriber.py: one ZMQ SUB per worker;
                     index.py: block -> workers per KV-cache group (block_map.py), the workers' slots; fleet_hit.py:
                     the usable hybrid hit of a prompt on every worker in one pass; groups.py: the groups learned;
                     block_hash.py: vLLM's block hashes, reproduced; prompt_keys.py: a prompt's keys, lazily and
                     through a cross-request cache; hash_check.py: the workers' hashing checked from their events;
                     request_hits.py: the per-request hit memo the flow, the scorers and the deciders read
placement/           where a turn's prompt is computed: disagg.py (the shared gates, then --pd-policy);
                     cost_model.py (ours: TTFT and stall in ms, pure); online_rates.py (its rates, learned);
                     peer_policies.py (the field's deciders); decider.py (one turn's decision and what it teaches)
discovery/           k8s.py: Kubernetes EndpointSlices, listed then watched (polled when watches fail);
                     endpointslices.py: slices -> workers (ready, terminating); k8s_api.py: list and watch
workers.py, health.py, engine_load.py, admission.py, timers.py, metrics.py, memory.py, background.py
"""
