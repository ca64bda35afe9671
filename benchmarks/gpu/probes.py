"""Requests the GPU benchmark (bench.py) sends alone, outside its workloads: the phase probe (each request alone,
every server's /metrics before and after it: merge.py's phase table, phases.py) and the decoder's ITL with no
prefill load (`decode_alone`)."""

from __future__ import annotations

import threading
import time

from benchmarks.client import log, metric_deltas, scrape, stream_logprobs
from benchmarks.setups import Setup
from benchmarks.workloads import Tokens, agentic, oracle_hits


def probe(setup: Setup, tokens: Tokens, length: int, max_tokens: int, block: int, salt: int = 0) -> list[dict]:
    """Two 3-turn conversations (cold, then warm: same lengths, other tokens), each request alone, with every
    server's /metrics before and after it. Turn 1 is new; turns 2-3 extend the previous prompt. `salt`: other
    prompts of the same shapes (a proxy variant's probe, on engines that cached the first ones)."""
    out = []
    for phase, seed in (("cold", 101 + 7919 * salt), ("warm", 202 + 7919 * salt)):
        reqs = agentic(tokens, max(64, int(length / 3.45)), sessions=1, turns=3, seed=seed)
        oracle = oracle_hits(reqs, block) if block else [None] * len(reqs)
        for req, best in zip(reqs, oracle):
            before = {k: scrape(u) for k, u in setup.metric_urls.items()}
            body = {"model": "m", "prompt": list(req.token_ids), "max_tokens": max_tokens, "temperature": 0,
                    "ignore_eos": True}
            seen = setup.send(body)
            time.sleep(0.3)  # let the engines' metric loggers publish this request
            after = {k: scrape(u) for k, u in setup.metric_urls.items()}
            arr = seen["arrivals"]
            out.append({"phase": phase, "turn": req.turn, "prompt_tokens": len(req.token_ids), "oracle_hit": best,
                        "hit_tokens": seen["hit_tokens"], "ttft_s": arr[0] if arr else None, "p_s": seen["p_s"],
                        "e2e_s": seen["e2e_s"], "text": seen["text"], "deltas": metric_deltas(before, after)})
            log(f"probe {phase} turn {req.turn}: {len(req.token_ids)} tokens, hit {seen['hit_tokens']}, "
                f"TTFT {out[-1]['ttft_s'] * 1e3:.1f} ms")
    return out


def decode_alone(setup: Setup, tokens: Tokens, length: int, conc: int, max_tokens: int) -> dict:
    """`conc` new prompts of `length` tokens sent together straight to the engine that decodes (D, or the
    colocated engine). Once the last stream has its first token no prefill runs there: the token gaps from then
    until the first stream ends are that engine's ITL at this batch and context with no prefill load."""
    import random

    url = (setup.decoder or setup.front).url
    rng = random.Random(7000 + conc + length)
    prompts = [tokens.sized(rng, length) for _ in range(conc)]
    got: list[tuple[float, list[float]] | None] = [None] * conc
    gate = threading.Barrier(conc)

    def one(i: int) -> None:
        body = {"model": "m", "prompt": list(prompts[i]), "max_tokens": max_tokens, "temperature": 0,
                "ignore_eos": True}
        gate.wait()
        sent = time.monotonic()
        got[i] = (sent, stream_logprobs(url, body)["arrivals"])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(conc)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    streams = [[sent + a for a in arr] for sent, arr in (g for g in got if g) if arr]
    if len(streams) < conc:
        return {"concurrency": conc, "length": length, "error": f"{conc - len(streams)} streams failed"}
    return {"concurrency": conc, "length": length, "max_tokens": max_tokens} | all_decoding(streams)


def all_decoding(streams: list[list[float]]) -> dict:
    """The token gaps (ms percentiles) that fall between the last stream's first token and the first stream's
    last: the window in which every stream decodes and none waits for its prefill."""
    since, until = max(s[0] for s in streams), min(s[-1] for s in streams)
    gaps = sorted(b - a for s in streams for a, b in zip(s, s[1:]) if a >= since and b <= until)
    pick = lambda q: gaps[min(len(gaps) - 1, int(q * len(gaps)))] * 1e3 if gaps else None  # noqa: E731
    return {"gaps": len(gaps), "window_s": until - since, "itl_p50_ms": pick(0.5), "itl_p99_ms": pick(0.99)}
