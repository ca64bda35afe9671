"""The handshake once per (P, D) with real engines (our connector on both, the tiny model): through the proxy,
P's first answer carries its handshake and the next ones do not (the proxy told P that D knows its engine), and
every turn is still read over NIXL, none failed or computed by D instead. Under always-remote P stops at N-1 and
ships no aligned checkpoint below it (the proxy marks its request: no turn on D alone would resume from one).

Runs in the engine lane (`-m engines`)."""

from __future__ import annotations

import aiohttp
import pytest

from hybrid_pd.proxy.app import serve_in_background
from hybrid_pd.proxy.config import ProxyConfig
from tests.proxy.fakes import run
from tests.support.conversation import text_of
from tests.support.engines import d_metrics, delta

pytestmark = pytest.mark.engines


def test_later_turns_read_without_the_handshake(engine_set, tiny_model):
    urls = engine_set({"p": ("prefill", "hybrid", "0", tiny_model, {"HYBRID_PD_LEASE_S": "10"}),
                       "d": ("decode", "hybrid", "1", tiny_model, {})}).up("p", "d")

    async def body():
        config = ProxyConfig.from_flat({"port": 0, "prefill": [urls["p"]], "decode": [urls["d"]],
                                        "health_interval": 0, "load_interval": 0, "pd_policy": "always-remote",
                                        "prefiller_stop": "last"})
        async with serve_in_background(config) as proxy, aiohttp.ClientSession() as s:
            memo, carried, shipped = proxy.app.flow.handshakes, [], []
            record = memo.seen

            def seen(prefiller, params):
                carried.append(bool(params.get("handshakes")))
                shipped.append((params["remote_num_tokens"], params.get("checkpoints")))
                record(prefiller, params)

            memo.seen = seen
            before = d_metrics(urls["d"])
            for salt in (1, 2, 3):
                req = {"model": "tiny", "prompt": text_of(300, salt), "max_tokens": 4, "temperature": 0.0}
                async with s.post(proxy.url + "/v1/completions", json=req) as r:
                    assert r.status == 200, await r.text()
            moved = delta(before, d_metrics(urls["d"]))
            assert carried == [True, False, False]
            assert all(n > 256 and checkpoints == [] for n, checkpoints in shipped), shipped  # a boundary below N-1
            assert moved["hybrid_pd_bytes_transferred_count"] == 3 and moved["hybrid_pd_failed_transfers_total"] == 0
            assert proxy.state.metrics.requests.labels("completions", "remote_prefill", "200").value == 3

    run(body(), timeout=300)
