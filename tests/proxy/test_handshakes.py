"""P's handshake reaches each decoder once per prefiller engine (proxy/handshakes.py), with fake workers: the
second request of a (P, D) pair goes to D without it, every other field as P sent it; a prefiller that restarted
(a new engine id), another decoder, and a decoder whose connection failed get it again; an answer that failed
marks nothing."""

from __future__ import annotations

import aiohttp

from hybrid_pd.connector.contract import DECODER_KNOWS
from tests.proxy.fakes import cluster, run

HANDSHAKES = ["aGFuZHNoYWtlIG9mIHJhbmsgMA=="]


async def complete(url: str) -> int:
    async with aiohttp.ClientSession() as s, s.post(url + "/v1/completions",
                                                    json={"model": "m", "prompt": "hi", "max_tokens": 2}) as r:
        await r.read()
        return r.status


def params_seen(worker) -> list[dict]:
    return [s.body["kv_transfer_params"] for s in worker.generate_calls]


def test_the_handshake_goes_once_per_prefiller_engine_and_decoder():
    async def body():
        async with cluster(n_decode=2, decode_policy="none", decode_picker="round_robin") as c:
            p, (d1, d2) = c.prefill[0], c.decode
            p.extra_ktp = {"handshakes": HANDSHAKES}
            for _ in range(4):  # round robin: d1, d2, d1, d2
                assert await complete(c.url) == 200
            first, again = params_seen(d1)
            assert first["handshakes"] == HANDSHAKES and "handshakes" not in again
            assert {k: v for k, v in first.items() if k != "handshakes"} == again
            assert [("handshakes" in x) for x in params_seen(d2)] == [True, False]
            # and P is told, once the picked decoder has it, which engine's handshake that decoder holds
            engine = f"engine-{p.url}"
            assert [x.get(DECODER_KNOWS) for x in params_seen(p)] == [None, None, engine, engine]
            p.extra_ktp["remote_engine_id"] = "restarted"  # P came back as another engine
            d2.status = 500  # and d2 fails this turn: nothing is marked for it
            for _ in range(4):
                await complete(c.url)
            assert [("handshakes" in x) for x in params_seen(d1)[2:]] == [True, False]
            assert [("handshakes" in x) for x in params_seen(d2)[2:]] == [True, True]
            # (the first call after the restart names the old engine, which a restarted P does not take as its own)
            assert [x.get(DECODER_KNOWS) for x in params_seen(p)[4:]] == [engine, None, "restarted", None]

    run(body())


def test_a_decoder_whose_connection_failed_gets_it_again():
    async def body():
        async with cluster(n_decode=2, decode_policy="none", decode_picker="round_robin") as c:
            p, (d1, d2) = c.prefill[0], c.decode
            p.extra_ktp = {"handshakes": HANDSHAKES}
            flow = c.proxy.app.flow
            for _ in range(2):
                await complete(c.url)
            flow.handshakes.forget(d1.url)  # what a connection failure to d1 does (pd_flow._decode)
            for _ in range(2):
                await complete(c.url)
            assert [("handshakes" in x) for x in params_seen(d1)] == [True, True]
            assert [("handshakes" in x) for x in params_seen(d2)] == [True, False]

    run(body())
