"""The first PD turn of each (prefiller, decoder) pair is the proxy's, not a client's.

The launchers' warm-up compiles what one engine computes (prefill/launch/warmup.py), but the first READ between a
prefiller and a decoder is still slow: the NIXL handshake, UCX mapping the peer's memory, the load path's first
kernels on D. On one H200 (benchmarks/results/2026-11-26-h200-qwen3next-full-graphs) the first remote turn of
each run took 0.9-1.7 s where the next ones took 0.1-0.2 s, and in a run of ten turns that one turn was most of
the throughput we lost. With --warm-pairs the proxy sends each admitted pair one short PD request of its own (P
to its stop, then D with P's kv_transfer_params, one token each) as soon as both are admitted, and again after
either was ejected and came back (a restarted engine has a new NIXL agent). Until every admitted pair's first
warm-up has ended, for PAIR_WARMUP_WAIT_S at most, /health (readiness) answers 503 "warming the PD pairs".

A failed warm-up is logged and not retried until the pair is admitted anew: the client's request then pays what
the warm-up would have, and nothing else changes.
"""

from __future__ import annotations

import logging
import time

from .errors import UpstreamError
from .state import ProxyState
from .workers import Worker

log = logging.getLogger("hybrid_pd.proxy")

PAIR_WARMUP_WAIT_S = 90.0
# words of the warm-up prompt: > 2 aligned blocks of every model we run (544 tokens on Qwen3-Next's shapes), so
# that P ships blocks and a checkpoint and D reads them as a client's turn makes it do
WARMUP_WORDS = 1200
WARMUP_TEXT = " ".join(["the quick brown fox jumps over the lazy dog"] * (WARMUP_WORDS // 9 + 1))

Pair = tuple[str, str | None, str, str | None]  # (P's URL, its identity, D's URL, its identity)


def pair_key(p: Worker, d: Worker) -> Pair:
    return (p.url, p.identity, d.url, d.identity)


async def warm_pairs(state: ProxyState) -> None:
    """One round: forget the pairs of which a worker is no longer admitted, warm every admitted pair not warmed
    yet (one after the other: a warm-up loads both engines), then lift the readiness gate."""
    admitted = {("prefill", w.url, w.identity) for w in state.pool.admitted("prefill")} | {
        ("decode", w.url, w.identity) for w in state.pool.admitted("decode")
    }
    state.pairs_warmed = {
        k for k in state.pairs_warmed if ("prefill", k[0], k[1]) in admitted and ("decode", k[2], k[3]) in admitted
    }
    for p in state.pool.admitted("prefill"):
        for d in state.pool.admitted("decode"):
            key = pair_key(p, d)
            if key not in state.pairs_warmed:
                state.pairs_warmed.add(key)  # once per admission, whatever the outcome
                await warm_pair(state, p, d)
    state.pairs_warming_until = 0.0


async def warm_pair(state: ProxyState, p: Worker, d: Worker) -> bool:
    """One PD request of the proxy's own through P and D; True when D answered."""
    timeouts = state.config.timeouts
    began = time.perf_counter()
    try:
        models = await state.upstream.get_json(d.url, "/v1/models", timeout=timeouts.health_s, stage="models")
        model = models["data"][0]["id"]
        body = {"model": model, "prompt": WARMUP_TEXT, "max_tokens": 1, "temperature": 0}
        answer = await state.upstream.post_json(
            p.url,
            "/v1/completions",
            body | {"kv_transfer_params": {"do_remote_decode": True}},
            timeout=timeouts.prefill_s,
            stage="warmup_prefill",
        )
        params = answer.get("kv_transfer_params") if isinstance(answer, dict) else None
        if not isinstance(params, dict) or not params:
            log.warning("PD warm-up %s -> %s: the prefiller returned no kv_transfer_params", p.url, d.url)
            return False
        await state.upstream.post_json(
            d.url,
            "/v1/completions",
            body | {"kv_transfer_params": params},
            timeout=timeouts.decode_first_byte_s,
            stage="warmup_decode",
        )
    except (UpstreamError, KeyError, IndexError, TypeError) as e:
        log.warning("PD warm-up %s -> %s failed (%r): the pair's first client turn pays it", p.url, d.url, e)
        return False
    log.info("PD warm-up %s -> %s: %.0f ms", p.url, d.url, (time.perf_counter() - began) * 1000)
    return True
