"""The KV-event index end to end: events over ZMQ -> index -> decoder choice, skipped remote prefill,
cached_tokens; tokenization through the worker's /tokenize; token ids forwarded."""

from __future__ import annotations

import contextlib

import aiohttp

from hybrid_pd.proxy.kv.block_hash import block_key, chained_block_hashes
from hybrid_pd.proxy.kv.events import BlockStored, KVEventBatch
from tests.proxy.fakes import FakeWorker, metric_value, run, tokens_of
from tests.proxy.kv_publisher import FakePublisher

PROMPT = "abcdefghijklmnop"  # 16 fake tokens = 4 blocks of 4
TOKENS = tokens_of(PROMPT)
HASHES = chained_block_hashes(TOKENS, 4)


def stored(hashes, group, kind, block_size=4):
    return BlockStored(block_hashes=list(hashes), parent_block_hash=None, token_ids=[], block_size=block_size,
                       medium="GPU", group_idx=group, kv_cache_spec_kind=kind)


@contextlib.asynccontextmanager
async def kv_cluster(**options):
    from hybrid_pd.proxy.app import serve_in_background
    from hybrid_pd.proxy.config import ProxyConfig

    p, d1, d2 = FakeWorker("prefill"), FakeWorker("decode"), FakeWorker("decode")
    pubs = [FakePublisher() for _ in range(3)]
    try:
        for w in (p, d1, d2):
            await w.start()
        config = ProxyConfig.from_flat({
            "port": 0, "health_interval": 0, "prefill": [p.url], "decode": [d1.url, d2.url],
            "prefill_events": [pubs[0].endpoint], "decode_events": [pubs[1].endpoint, pubs[2].endpoint],
            "decode_policy": "kv_hit", "decode_picker": "first", "prefill_policy": "kv_hit,least_loaded", **options})
        async with serve_in_background(config) as proxy:
            idx = proxy.state.kv_index
            for pub, w in zip(pubs, (p, d1, d2)):
                await pub.connected(idx, w.url)
            yield proxy, p, d1, d2, pubs
    finally:
        for pub in pubs:
            pub.close()
        for w in (p, d1, d2):
            await w.stop()


async def post(url, path, body):
    async with aiohttp.ClientSession() as s, s.post(url + path, json=body) as r:
        return r.status, await r.json()


def test_decoder_with_the_usable_hybrid_hit_wins_and_cached_tokens_count_it():
    async def body():
        async with kv_cluster(decoder_hit_ratio=0.9) as (proxy, p, d1, d2, pubs):
            idx = proxy.state.kv_index
            # d1: 3 attention blocks but no Mamba checkpoint -> usable hit 0
            await pubs[1].send(KVEventBatch(0.0, [stored(HASHES[:3], 0, "full_attention")]))
            # d2: 3 attention blocks and a checkpoint after block 2 -> usable hit 8 tokens
            seq = await pubs[2].send(KVEventBatch(0.0, [stored(HASHES[:3], 0, "full_attention"),
                                                        stored([HASHES[1]], 1, "mamba")]))
            await pubs[2].delivered(idx, d2.url, seq)
            p.cached_tokens = 4
            status, out = await post(proxy.url, "/v1/completions", {"prompt": PROMPT, "max_tokens": 3})
            assert status == 200
            assert d1.generate_calls == [] and len(d2.generate_calls) == 1
            assert [s.path for w in (d1, d2) for s in w.seen if s.path == "/tokenize"] == ["/tokenize"]
            d_body, p_body = d2.generate_calls[0].body, p.generate_calls[0].body
            assert d_body["prompt"] == TOKENS and p_body["prompt"] == TOKENS  # token ids forwarded
            assert "kv_transfer_params" in d_body  # 8/16 < 0.9: still a remote prefill
            # max(P's hit 4, D's local usable hit 8)
            assert out["usage"]["prompt_tokens_details"]["cached_tokens"] == 8
            m = proxy.state.metrics.render().decode()
            assert metric_value(m, "hybrid_pd_proxy_hit_tokens_total", kind="decoder_local") == 8
            assert metric_value(m, "hybrid_pd_proxy_routing_decisions_total", role="decode", worker=d2.url) == 1
    run(body())


def test_decoder_holding_most_of_the_prompt_prefills_itself():
    async def body():
        async with kv_cluster(decoder_hit_ratio=0.5) as (proxy, p, d1, d2, pubs):
            seq = await pubs[2].send(KVEventBatch(0.0, [stored(HASHES, 0, "full_attention"),
                                                        stored([HASHES[1]], 1, "mamba")]))
            await pubs[2].delivered(proxy.state.kv_index, d2.url, seq)
            status, _ = await post(proxy.url, "/v1/chat/completions",
                                   {"messages": [{"role": "user", "content": PROMPT}]})
            assert status == 200 and p.generate_calls == []
            assert "kv_transfer_params" not in d2.generate_calls[0].body
            m = proxy.state.metrics.render().decode()
            assert metric_value(m, "hybrid_pd_proxy_disagg_decisions_total", decision="local_decoder_hit") == 1
    run(body())


def test_a_busy_decoder_sends_the_turn_it_holds_to_the_prefiller():
    """The cost model (disagg.local_is_cheaper, no fixed remote cost here): D holds 8 of 16 tokens, P none. D
    prefills the 8 itself while it decodes at most one other stream (8 x 2 <= 16), and with two streams in flight
    the turn goes to P (8 x 3 > 16): D's streams would each wait for that prefill."""
    async def body():
        async with kv_cluster(decoder_hit_ratio=0.5, remote_overhead_tokens=0) as (proxy, p, d1, d2, pubs):
            seq = await pubs[2].send(KVEventBatch(0.0, [stored(HASHES, 0, "full_attention"),
                                                        stored([HASHES[1]], 1, "mamba")]))
            await pubs[2].delivered(proxy.state.kv_index, d2.url, seq)
            d2.hang_stream_after_first = True
            async with aiohttp.ClientSession() as s:
                streams = []
                for _ in range(2):  # two streams held open on D after their first piece
                    r = await s.post(proxy.url + "/v1/completions", json={"prompt": PROMPT, "stream": True})
                    assert r.status == 200 and (await r.content.readline()).startswith(b"data:")
                    streams.append(r)
                m = proxy.state.metrics.render().decode()
                assert metric_value(m, "hybrid_pd_proxy_disagg_decisions_total", decision="local_decoder_hit") == 2
                assert p.generate_calls == []
                status, _ = await post(proxy.url, "/v1/completions", {"prompt": PROMPT, "max_tokens": 3})
                assert status == 200 and len(p.generate_calls) == 1
                assert "kv_transfer_params" in d2.generate_calls[-1].body
                m = proxy.state.metrics.render().decode()
                assert metric_value(m, "hybrid_pd_proxy_disagg_decisions_total", decision="remote_decoder_busy") == 1
                d2.release.set()
                for r in streams:
                    await r.read()
                    r.release()
    run(body())


def test_short_prompts_prefill_on_the_decoder():
    """The gate every policy shares (--min-prompt-tokens), under one that otherwise always disaggregates."""
    async def body():
        async with kv_cluster(min_prompt_tokens=17, pd_policy="always-remote") as (proxy, p, d1, d2, pubs):
            status, _ = await post(proxy.url, "/v1/completions", {"prompt": PROMPT})
            assert status == 200 and p.generate_calls == []
            status, _ = await post(proxy.url, "/v1/completions", {"prompt": PROMPT + "q"})
            assert status == 200 and len(p.generate_calls) == 1
    run(body())


def test_removed_blocks_and_restarts_update_the_index():
    async def body():
        from hybrid_pd.proxy.kv.events import AllBlocksCleared, BlockRemoved

        async with kv_cluster() as (proxy, p, d1, d2, pubs):
            idx = proxy.state.kv_index
            seq = await pubs[2].send(KVEventBatch(0.0, [stored(HASHES[:2], 0, "full_attention"),
                                                        stored([HASHES[1]], 1, "mamba")]))
            await pubs[2].delivered(idx, d2.url, seq)
            assert idx.hit_tokens(d2.url, 16, lambda h: chained_block_hashes(TOKENS, h)) == 8
            seq = await pubs[2].send(KVEventBatch(0.0, [BlockRemoved([HASHES[1]], "GPU", group_idx=1)]))
            await pubs[2].delivered(idx, d2.url, seq)
            assert idx.hit_tokens(d2.url, 16, lambda h: chained_block_hashes(TOKENS, h)) == 0
            pubs[2].seq += 5  # five batches lost on the way
            seq = await pubs[2].send(KVEventBatch(0.0, [AllBlocksCleared()]))
            await pubs[2].delivered(idx, d2.url, seq)
            assert idx.workers[d2.url].gaps == 5
            assert all(not hs for hs in idx.held(d2.url).values())
            m = proxy.state.metrics.render().decode()
            assert metric_value(m, "hybrid_pd_proxy_kv_event_gaps_total", worker=d2.url) == 5
            await pubs[2].send_raw([b"t", b"\x00" * 8, b"not msgpack"])  # garbage is counted, not fatal
            pubs[2].seq = 0  # the engine restarted: the index starts over
            seq = await pubs[2].send(KVEventBatch(0.0, [stored(HASHES[:1], 0, "full_attention")]))
            await pubs[2].delivered(idx, d2.url, seq)
            assert idx.workers[d2.url].gaps == 0 and idx.held(d2.url)[0] == {block_key(HASHES[0])}
            m = proxy.state.metrics.render().decode()
            assert metric_value(m, "hybrid_pd_proxy_kv_event_errors_total", worker=d2.url) == 1
    run(body())


def test_a_removed_worker_loses_its_subscription_and_index():
    async def body():
        from hybrid_pd.proxy.config import WorkerSpec

        async with kv_cluster() as (proxy, p, d1, d2, pubs):
            state = proxy.state
            assert d2.url in state.kv_index.workers
            state.pool.set_workers("decode", [WorkerSpec(d1.url, pubs[1].endpoint)])
            assert d2.url not in state.kv_index.workers
            seq = await pubs[1].send(KVEventBatch(0.0, [stored(HASHES[:1], 0, "full_attention")]))
            await pubs[1].delivered(state.kv_index, d1.url, seq)  # the kept worker still streams
            await pubs[2].send(KVEventBatch(0.0, [stored(HASHES[:1], 0, "full_attention")]))
            state.pool.set_workers("decode", [WorkerSpec(d1.url, pubs[1].endpoint),
                                              WorkerSpec(d2.url, pubs[2].endpoint)])
            await pubs[2].connected(state.kv_index, d2.url)  # a returning worker is subscribed again
    run(body())


def test_endpoint_modes():
    from hybrid_pd.proxy.kv.subscriber import endpoint_mode

    assert endpoint_mode("tcp://127.0.0.1:5700") == ("bind", "tcp://127.0.0.1:5700")
    assert endpoint_mode("tcp://10.1.2.3:5700") == ("connect", "tcp://10.1.2.3:5700")
    assert endpoint_mode("connect:tcp://127.0.0.1:5700") == ("connect", "tcp://127.0.0.1:5700")
    assert endpoint_mode("bind:tcp://0.0.0.0:5700") == ("bind", "tcp://0.0.0.0:5700")


def test_proxy_binds_for_a_publisher_that_connects():
    """What vLLM does for an endpoint with a concrete host (the launchers' 127.0.0.1): its PUB connects."""
    async def body():
        import zmq
        import zmq.asyncio

        from hybrid_pd.proxy.app import serve_in_background
        from hybrid_pd.proxy.config import ProxyConfig
        from tests.support.procs import free_port

        d = FakeWorker("decode")
        await d.start()
        endpoint = f"tcp://127.0.0.1:{free_port()}"
        ctx = zmq.asyncio.Context()
        pub = ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.connect(endpoint)  # before the proxy listens: ZMQ keeps retrying
        try:
            config = ProxyConfig.from_flat({"port": 0, "health_interval": 0, "decode": [d.url],
                                            "decode_events": [endpoint]})
            async with serve_in_background(config) as proxy:
                publisher = FakePublisher.__new__(FakePublisher)
                publisher.sock, publisher.seq = pub, 0
                await publisher.connected(proxy.state.kv_index, d.url)
        finally:
            pub.close(0)
            ctx.term()
            await d.stop()
    run(body())
