"""The PD tax with and without --early-decode, on the same engines in the same run, turns interleaved.

One P (core 0) and one D (core 1) of the tiny model, our connector, D with a params inbox; two proxies in front of
them at once, both `--pd-policy always-remote` (every turn P then D): "sequential" (today's flow: D's request
after P's answer) and "early" (--early-decode: D's request with P's, P's params to D's inbox). Turns are sent one
at a time, alternating which proxy goes first in each pair, each with a fresh prompt (no cache hit anywhere), at
each --words length. Per turn: the client's TTFT (streamed, to the first token), and from the proxy's
--log-placement lines, P's call and the time from P's answer reaching the proxy to D's first byte there (what
early decode shortens: D's HTTP path, tokenization and scheduling now run while P computes).

    bash deploy/dev.sh run python -m benchmarks.early_decode [--pairs 20] [--words 300,1500] [--out DIR]
    bash deploy/dev.sh run python -m benchmarks.early_decode --from-logs SEQUENTIAL.log EARLY.log

`--channel N`: only the delivery itself, N times: the proxy's outbox (proxy/params_outbox.py) to a decoder's
inbox (connector/params_inbox.py) waiting in another thread as an idle decoder's step does, with params the size
of a first turn's (P's handshake in them, ~4 KB) and of a later one's (~0.5 KB).
`--from-logs`: the same figures of P's call and after P from two proxies' logs of another run (the GPU plan
deploy/gpu/plans/early-decode.sh: the set-up's proxy log, then its --early-decode variant's).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

from benchmarks.procs import HYBRID_PD, Launched, free_port
from benchmarks.setups import inbox_url, start_pd_pair
from hybrid_pd.prefill.dev.demo_workload import transfer_counters
from hybrid_pd.prefill.dev.tiny_model import TinyModelSpec, build_tiny_model
from tests.support.conversation import text_of

MODES = ("sequential", "early")
TIMING = re.compile(r"pd timing (\S+): early=(\d) mode=(\S+) prefill_ms=([\d.]+) after_prefill_ms=([\d.]+)")


def ttft_of(url: str, prompt: str, request_id: str) -> float:
    """Seconds from sending a streamed completion to its first token."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 4, "temperature": 0.0, "ignore_eos": True,
            "stream": True}
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", "X-Request-Id": request_id})
    start, first = time.monotonic(), None
    with urllib.request.urlopen(req, timeout=300) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if first is None and line.startswith("data: {") and '"text":""' not in line.replace(" ", ""):
                first = time.monotonic() - start
    assert first is not None, f"{request_id}: no token"
    return first


def channel(n: int) -> str:
    """Delivery latency (outbox send -> inbox drain returns it), microseconds, p50 / p99, per params size."""
    return asyncio.run(_channel(n))


async def _channel(n: int) -> str:
    import threading

    from hybrid_pd.connector.params_inbox import ParamsInbox
    from hybrid_pd.proxy.params_outbox import ParamsOutbox

    inbox, outbox = ParamsInbox("127.0.0.1", free_port()), ParamsOutbox()
    rows = []
    try:
        for label, size in (("first turn (~4 KB)", 4096), ("later turn (~0.5 KB)", 512)):
            params = {"remote_engine_id": "P", "remote_block_ids": [list(range(16))] * 2, "blob": "x" * size}
            took: list[float] = []
            for i in range(n):
                sent = [0.0]
                t = threading.Thread(target=_receive, args=(inbox, sent, took))
                t.start()
                time.sleep(0.001)  # the decoder waits on its inbox already
                sent[0] = time.perf_counter()
                assert await outbox.deliver(inbox.address, f"k{i}", params)
                t.join(5)
            took.sort()
            rows.append(f"| {label} | {n} | {took[n // 2] * 1e6:.0f} | {took[int(0.99 * (n - 1))] * 1e6:.0f} |")
    finally:
        outbox.close()
        inbox.close()
    return "\n".join(["| params | deliveries | p50 us | p99 us |", "|---|---|---|---|", *rows])


def _receive(inbox, sent: list[float], took: list[float]) -> None:
    while not inbox.drain(0.002):  # an idle decoder's step: a short wait on the inbox, again
        pass
    took.append(time.perf_counter() - sent[0])


def timings(log_text: str) -> dict[str, dict]:
    """Request id -> its PD turn's figures, from a proxy's --log-placement lines."""
    return {m[1]: {"early": m[2] == "1", "turn_mode": m[3], "prefill_ms": float(m[4]), "after_prefill_ms": float(m[5])}
            for m in TIMING.finditer(log_text)}


def compare_logs(sequential: Path, early: Path) -> str:
    got = {mode: list(timings(path.read_text(errors="replace")).values())
           for mode, path in (("sequential", sequential), ("early", early))}
    rows = ["| proxy | PD turns | P's call p50 ms | after P p50 ms | after P p90 ms |", "|---|---|---|---|---|"]
    for mode, turns in got.items():
        after = sorted(t["after_prefill_ms"] for t in turns)
        p90 = after[int(0.9 * (len(after) - 1))] if after else float("nan")
        rows.append(f"| {mode} | {len(turns)} | {p50([t['prefill_ms'] for t in turns]):.1f} | {p50(after):.1f} | "
                    f"{p90:.1f} |")
    ratio = p50([t["after_prefill_ms"] for t in got["early"]]) / p50([t["after_prefill_ms"] for t in got["sequential"]])
    return "\n".join(rows) + f"\n\nafter P p50, early / sequential: {ratio:.2f}"


def p50(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=20, help="turns per mode and length")
    ap.add_argument("--words", default="300,1500", help="prompt lengths in words")
    ap.add_argument("--warmup", type=int, default=3, help="untimed turns per mode first")
    ap.add_argument("--out", default="", help="folder for raw.json and table.md")
    ap.add_argument("--from-logs", nargs=2, type=Path, metavar=("SEQUENTIAL", "EARLY"),
                    help="only compare two proxies' logs of another run")
    ap.add_argument("--channel", type=int, default=0, metavar="N", help="only time N deliveries of the channel")
    args = ap.parse_args()
    if args.channel:
        print(channel(args.channel))
        return
    if args.from_logs:
        print(compare_logs(*args.from_logs))
        return
    logs = Path(tempfile.mkdtemp(prefix="early-decode-"))
    model = str(build_tiny_model(TinyModelSpec()))
    procs: list[Launched] = []
    try:
        pair = start_pd_pair(model, logs, procs, 600)
        inbox = inbox_url(pair["d"])
        assert inbox, "the decoder has no params inbox (benchmarks/setups.py launcher_argv)"
        proxies = {}
        for mode in MODES:
            port = free_port()
            extra = ["--early-decode", "--decode-inbox", inbox] if mode == "early" else []
            proxies[mode] = Launched(f"proxy-{mode}", [
                HYBRID_PD, "proxy", "--port", str(port), "--prefill", pair["p"].url, "--decode", pair["d"].url,
                "--pd-policy", "always-remote", "--log-placement", *extra], f"http://127.0.0.1:{port}", logs)
            procs.append(proxies[mode])
            proxies[mode].wait_healthy(120)
        for i in range(args.warmup):
            for mode in MODES:
                ttft_of(proxies[mode].url, text_of(300, 5_000_000 + 10 * i + MODES.index(mode)), f"warm-{mode}-{i}")
        before = transfer_counters(pair["d"].url)
        turns = []
        for words in map(int, args.words.split(",")):
            for i in range(args.pairs):
                for mode in MODES if i % 2 == 0 else MODES[::-1]:
                    rid = f"bench-{mode}-{words}-{i}"
                    prompt = text_of(words, 6_000_000 + 1000 * words + 10 * i + MODES.index(mode))
                    turns.append({"id": rid, "mode": mode, "words": words,
                                  "ttft_ms": ttft_of(proxies[mode].url, prompt, rid) * 1000})
        moved = {k: v - before[k] for k, v in transfer_counters(pair["d"].url).items()}
        for mode in MODES:
            proxies[mode].stop()
        seen = {k: v for mode in MODES for k, v in timings(proxies[mode].log_path.read_text()).items()}
        for t in turns:
            t.update(seen.get(t["id"], {}))
        table = ["| words | turns per mode | TTFT p50 ms, sequential | early | early / sequential | "
                 "P's answer -> D's first byte p50 ms, sequential | early | early / sequential | P's call p50 ms, "
                 "sequential | early |", "|---|---|---|---|---|---|---|---|---|---|"]
        for words in map(int, args.words.split(",")):
            got = {mode: [t for t in turns if t["words"] == words and t["mode"] == mode] for mode in MODES}
            ttft = {mode: p50([t["ttft_ms"] for t in got[mode]]) for mode in MODES}
            after = {mode: p50([t["after_prefill_ms"] for t in got[mode] if "after_prefill_ms" in t]) for mode in MODES}
            call = {mode: p50([t["prefill_ms"] for t in got[mode] if "prefill_ms" in t]) for mode in MODES}
            table.append(f"| {words} | {len(got['early'])} | {ttft['sequential']:.1f} | {ttft['early']:.1f} | "
                         f"{ttft['early'] / ttft['sequential']:.2f} | {after['sequential']:.1f} | {after['early']:.1f}"
                         f" | {after['early'] / after['sequential']:.2f} | {call['sequential']:.1f} | "
                         f"{call['early']:.1f} |")
        modes = {t.get("turn_mode") for t in turns}
        table.append(f"\nturn modes seen: {sorted(str(m) for m in modes)}; D's transfers over the timed turns: "
                     f"{json.dumps(moved)}")
        print("\n".join(table))
        if args.out:
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            (out / "raw.json").write_text(json.dumps({"args": vars(args), "turns": turns, "moved": moved}, indent=1))
            (out / "table.md").write_text("\n".join(table) + "\n")
    finally:
        for proc in reversed(procs):
            proc.stop()


if __name__ == "__main__":
    main()
