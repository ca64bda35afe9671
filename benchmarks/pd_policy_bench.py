"""The PD deciders side by side on real tiny engines: ours (the placement model), always-remote (upstream's toy
proxy), Dynamo's isl-bounding and llm-d's non-cached-tokens, each as `--pd-policy` of our proxy.

One P (core 0) and one D (core 1), our connector, KV events on; one proxy at a time in front of them, restarted
per policy and round (rounds alternate the order). Each round runs its own agent sessions (fresh text: nothing
of another policy's cached): turn 0 a 500-word prompt, turn k+1 = turn k + D's answer (its token ids) + new
words, alternating a short tool result (15 words) and a long one (200 words); with `--suffix-words`, every turn
ends with a fixed instruction that the next one does not keep (it diverges where the suffix began: the agent
loop where the next turn diverges before the last boundary). `--chat`: the same loop as chat messages through
/v1/chat/completions (a system message, then each answer and tool result as messages of their own, the instruction
as the last user message), which the proxy tokenizes itself and where it knows where the last message starts
(--junction-checkpoints). `--concurrency` sessions at once. A policy may carry more proxy flags after a colon
(`ours:--no-junction-checkpoints`): each is a variant of its own in the tables.
Per policy: TTFT p50/p90, ITL p50/p90 (every gap between streamed pieces, pooled), output tok/s (answers' tokens over
the sessions' wall seconds), goodput (turns per second within the SLO: TTFT <= --slo-ttft-ms and the turn's ITL p90
<= --slo-itl-ms, benchmarks/gpu/judged.py's definition), the share of turns D served alone, P calls, bytes D pulled,
hybrid misroutes and the tokens they recomputed, index mispredictions (proxy metrics), and the placement model's
learned rates. `--answer-tokens` (default 8): each answer's length; longer answers keep D's streams running while
other sessions' turns arrive, where a prefill on D stalls them (what ours prices and the peers do not).

    bash deploy/dev.sh run python -m benchmarks.pd_policy_bench [--sessions 3] [--turns 6] [--rounds 2]
        [--concurrency 1] [--suffix-words 0] [--chat] [--policies ours,always-remote,isl-bounding,non-cached-tokens]
        [--itl-slo-ms 0] [--worker-args "-- --block-size 256"] [--answer-tokens 8] [--slo-ttft-ms 400]
        [--slo-itl-ms 100] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import shlex
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.client import metric_sum, placement_rates, scrape_metrics
from benchmarks.gpu.judged import good, pct
from benchmarks.procs import HYBRID_PD, Launched, free_port
from benchmarks.setups import events_url, start_pd_pair
from hybrid_pd.prefill.dev.demo_workload import stream, transfer_counters
from hybrid_pd.prefill.dev.tiny_model import TinyModelSpec, build_tiny_model
from tests.support.conversation import text_of, tokenize

POLICIES = ("ours", "always-remote", "isl-bounding", "non-cached-tokens")
ANSWER = 8
FIRST_WORDS, SHORT_TOOL, LONG_TOOL = 500, 15, 200


def stream_turn(url: str, prompt: list[int], answer: int = ANSWER) -> tuple[float, list[int], dict]:
    """(TTFT s, the answer's token ids, usage with the answer's text and its gaps) of one streamed completion."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": answer, "temperature": 0.0, "ignore_eos": True,
            "return_token_ids": True}
    ids: list[int] = []
    text, usage, ttft, arrivals = stream(url, "/v1/completions", body, token_ids=ids)
    return ttft, ids, usage | {"text": text, "gaps_ms": gaps_ms(arrivals)}


def gaps_ms(arrivals: list[float]) -> list[float]:
    """The gaps between a stream's pieces (ms): its ITLs."""
    return [round((b - a) * 1e3, 3) for a, b in zip(arrivals, arrivals[1:])]


def turn_row(k: int, prompt_tokens: int, ttft: float, usage: dict, gaps: list[float]) -> dict:
    hp = usage.get("hybrid_pd") or {}
    return {"turn": k, "prompt_tokens": prompt_tokens, "ttft_s": ttft, "computed_on": hp.get("computed_on"),
            "cached": (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0), "gaps_ms": gaps,
            "output_tokens": usage.get("completion_tokens", 0)}


def chat_session(proxy: str, salt: int, turns: int, suffix_words: int, answer: int = ANSWER) -> list[dict]:
    """`session` as chat: the history a list of messages, the instruction the last user message of every turn."""
    history = [{"role": "system", "content": text_of(FIRST_WORDS, salt)}]
    instruction = [{"role": "user", "content": text_of(suffix_words, 99)}] if suffix_words else []
    out = []
    for k in range(turns):
        body = {"model": "tiny", "messages": history + instruction, "max_tokens": answer, "temperature": 0.0,
                "ignore_eos": True}
        text, usage, ttft, arrivals = stream(proxy, "/v1/chat/completions", body)
        out.append(turn_row(k, usage.get("prompt_tokens", 0), ttft, usage, gaps_ms(arrivals)))
        words = SHORT_TOOL if k % 2 == 0 else LONG_TOOL
        history = history + [{"role": "assistant", "content": text},
                             {"role": "user", "content": text_of(words, salt * 100 + k)}]
    return out


def session(proxy: str, decode: str, salt: int, turns: int, suffix_words: int, answer: int = ANSWER) -> list[dict]:
    """An agent's turns: its history (+ a fixed instruction suffix, re-sent at the end of every turn and not
    kept: the next turn diverges where it began), then D's answer and a tool result join the history."""
    history = tokenize(decode, text_of(FIRST_WORDS, salt))
    suffix = tokenize(decode, " " + text_of(suffix_words, 99)) if suffix_words else []
    out = []
    for k in range(turns):
        prompt = history + suffix
        ttft, ids, usage = stream_turn(proxy, prompt, answer)
        if not ids:  # no token ids in the stream: its text, re-tokenized
            ids = tokenize(decode, usage["text"])
        out.append(turn_row(k, len(prompt), ttft, usage, usage["gaps_ms"]))
        words = SHORT_TOOL if k % 2 == 0 else LONG_TOOL
        history = history + ids + tokenize(decode, " " + text_of(words, salt * 100 + k))
    return out


def proxy_figures(url: str) -> dict[str, float]:
    m = scrape_metrics(url)
    p = "hybrid_pd_proxy_"
    return {"p_calls": metric_sum(m, p + "stage_latency_seconds_count{stage=\"prefill\"}"),
            "misroutes": metric_sum(m, p + "hybrid_misroutes_total"),
            "misroute_tokens": metric_sum(m, p + "hybrid_misroute_recomputed_tokens_total"),
            "mispredictions": metric_sum(m, p + "hit_mispredictions_total"),
            "mispredicted_tokens": metric_sum(m, p + "hit_mispredicted_tokens_total"),
            "junction_stops": metric_sum(m, p + "junction_stops_total")}


def table(results: dict[str, dict], slo_ttft_ms: float, slo_itl_ms: float) -> str:
    """The policies' figures as a markdown table."""
    lines = ["| policy | turns | TTFT p50 ms | TTFT p90 ms | ITL p50 ms | ITL p90 ms | output tok/s | "
             "goodput turns/s | D alone | P calls | MB pulled | hybrid misroutes (tokens recomputed) | "
             "index mispredictions (tokens) | junction stops |", "|---" * 14 + "|"]
    for policy, r in results.items():
        turns = r["turns"]
        ttfts = [t["ttft_s"] * 1e3 for t in turns]
        gaps = [g for t in turns for g in t.get("gaps_ms", [])]
        wall = r.get("wall_s") or float("nan")
        tok_s = sum(t.get("output_tokens", 0) for t in turns) / wall
        goodput = sum(good(t, slo_ttft_ms, slo_itl_ms) for t in turns) / wall
        alone = sum(1 for t in turns if t["computed_on"] == "decode")
        itl = f"{pct(gaps, 0.5):.1f} | {pct(gaps, 0.9):.1f}" if gaps else "- | -"
        lines.append(
            f"| {policy} | {len(turns)} | {pct(ttfts, 0.5):.1f} | {pct(ttfts, 0.9):.1f} | {itl} | {tok_s:.1f} | "
            f"{goodput:.2f} | {alone}/{len(turns)} | {int(r['p_calls'])} | {r['bytes'] / 1e6:.1f} | "
            f"{int(r['misroutes'])} ({int(r['misroute_tokens'])}) | {int(r['mispredictions'])} "
            f"({int(r['mispredicted_tokens'])}) | {int(r['junction_stops'])} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=3)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--suffix-words", type=int, default=0, help="a fixed instruction after each turn's history")
    ap.add_argument("--chat", action="store_true", help="the sessions as chat messages (/v1/chat/completions)")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--itl-slo-ms", default="0")
    ap.add_argument("--out", default="")
    ap.add_argument("--answer-tokens", type=int, default=ANSWER, help="each answer's length (tokens)")
    ap.add_argument("--slo-ttft-ms", type=float, default=400.0, help="goodput's TTFT bound")
    ap.add_argument("--slo-itl-ms", type=float, default=100.0, help="goodput's bound on a turn's ITL p90")
    ap.add_argument("--worker-args", default="", help="launcher flags for both workers, then optionally -- and "
                    "vLLM flags (e.g. '-- --block-size 256')")
    args = ap.parse_args()
    policies = args.policies.split(",")
    logs = Path(tempfile.mkdtemp(prefix="pd-policy-bench-"))
    model = str(build_tiny_model(TinyModelSpec()))
    procs: list[Launched] = []
    results: dict[str, dict] = {p: {"turns": [], "p_calls": 0.0, "bytes": 0.0, "misroutes": 0.0,
                                    "misroute_tokens": 0.0, "mispredictions": 0.0, "mispredicted_tokens": 0.0,
                                    "junction_stops": 0.0, "rates": {}, "wall_s": 0.0} for p in policies}
    try:
        workers = start_pd_pair(model, logs, procs, 600, tuple(shlex.split(args.worker_args)))
        salt = 0
        for rnd in range(args.rounds):
            for policy in policies if rnd % 2 == 0 else list(reversed(policies)):
                port = free_port()
                proxy = Launched(f"proxy-{policy}-{rnd}", [
                    HYBRID_PD, "proxy", "--port", str(port), "--prefill", workers["p"].url, "--decode",
                    workers["d"].url, "--prefill-events", events_url(workers["p"]),
                    "--decode-events", events_url(workers["d"]), "--pd-policy", policy.split(":")[0],
                    "--itl-slo-ms", args.itl_slo_ms, *policy.partition(":")[2].split()],
                    f"http://127.0.0.1:{port}", logs)
                procs.append(proxy)
                proxy.wait_healthy(60)
                for k in range(30):  # until the proxy reads both workers' KV events (a restarted SUB misses some)
                    stream_turn(proxy.url, tokenize(workers["d"].url, text_of(120, 10**6 + 100 * rnd + k)))
                    m = scrape_metrics(proxy.url)
                    if len([key for key in m if key.startswith("hybrid_pd_proxy_kv_event_batches_total")]) >= 2:
                        break
                    time.sleep(0.3)
                before, moved = proxy_figures(proxy.url), transfer_counters(workers["d"].url)["bytes"]
                seeds = [7_000_000 + 1000 * (salt + i) for i in range(1, args.sessions + 1)]
                salt += args.sessions
                started = time.monotonic()
                with ThreadPoolExecutor(args.concurrency) as pool:
                    if args.chat:
                        chats = [(proxy.url, seed, args.turns, args.suffix_words, args.answer_tokens) for seed in seeds]
                        runs = pool.map(lambda job: chat_session(*job), chats)
                    else:
                        jobs = [(proxy.url, workers["d"].url, seed, args.turns, args.suffix_words, args.answer_tokens)
                                for seed in seeds]
                        runs = pool.map(lambda job: session(*job), jobs)
                    for turns in runs:
                        results[policy]["turns"] += turns
                results[policy]["wall_s"] += time.monotonic() - started
                after = proxy_figures(proxy.url)
                for key in before:
                    results[policy][key] += after[key] - before[key]
                results[policy]["bytes"] += transfer_counters(workers["d"].url)["bytes"] - moved
                results[policy]["rates"] = placement_rates(proxy.url)
                proxy.stop()
                procs.remove(proxy)
        print(f"\nsessions {args.sessions} x turns {args.turns} x rounds {args.rounds}, concurrency "
              f"{args.concurrency}, suffix {args.suffix_words} words, --itl-slo-ms {args.itl_slo_ms}"
              f"{', chat' if args.chat else ''}{f', workers {args.worker_args}' if args.worker_args else ''}")
        print(f"SLO: TTFT <= {args.slo_ttft_ms:.0f} ms, a turn's ITL p90 <= {args.slo_itl_ms:.0f} ms; answers of "
              f"{args.answer_tokens} tokens")
        print(table(results, args.slo_ttft_ms, args.slo_itl_ms))
        if "ours" in results:
            print("ours, rates learned (last round):", json.dumps(results["ours"]["rates"]))
        if args.out:
            Path(args.out).write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    finally:
        for proc in reversed(procs):
            proc.stop()


if __name__ == "__main__":
    main()
