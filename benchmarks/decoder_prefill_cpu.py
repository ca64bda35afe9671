"""Does our connector slow a decoder's own prefill (a turn D serves alone)? The CPU bed's analogue of
`benchmarks/gpu/prefill_probe.py --role decode`: two `hybrid-pd decode` launchers with the tiny model, one with our
connector and one without (`--connector none`, the colocated engine of the benchmarks), each on a core of its own,
then swapped between the cores. Every prompt goes to both, in alternating order: conversations of three turns (a
new prompt of WORDS words, then two extensions of it). Per request, the engine's scheduled-to-first-token
(vllm:request_prefill_time_seconds), queue time, steps and prefix hits from its /metrics; the median of the paired
ratios (ours / none) per turn and overall.

    python3 -m benchmarks.decoder_prefill_cpu --out DIR [--conversations 6] [--words 900]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

from benchmarks.client import log, metric_deltas, post_json, scrape
from benchmarks.gpu.prefill_probe import WATCH
from benchmarks.setups import CpuBed, Workers


def conversations(n: int, words: int, seed: int = 5) -> list[list[str]]:
    from hybrid_pd.prefill.dev.tiny_training import WORDS

    rng = random.Random(seed)

    def text(k: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(k))

    out = []
    for _ in range(n):
        first = text(words)
        second = f"{first} {text(words * 2 // 5)}"
        out.append([first, second, f"{second} {text(words * 3 // 10)}"])
    return out


def one_request(url: str, prompt: str) -> dict:
    """One prompt (max_tokens 1) to the engine at `url`: its wall time and WATCH's figures from its /metrics."""
    before = {"e": scrape(url)}
    t0 = time.monotonic()
    post_json(url + "/v1/completions", {"model": "tiny", "prompt": prompt, "max_tokens": 1, "temperature": 0})
    wall = (time.monotonic() - t0) * 1e3
    time.sleep(0.3)  # the engine's metric logger publishes the request
    moved = metric_deltas(before, {"e": scrape(url)})["e"]
    scale = {f: 1e3 if f.endswith("_ms") else 1 for f in WATCH.values()}
    return {"wall_ms": round(wall, 2)} | {f: round(moved.get(m, 0.0) * scale[f], 2) for m, f in WATCH.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--conversations", type=int, default=6, help="per core placement (two placements)")
    ap.add_argument("--words", type=int, default=900)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    convs = conversations(2 * args.conversations, args.words)
    rows: list[dict] = []
    for swap in (0, 1):
        names = ("none", "hybrid") if swap else ("hybrid", "none")
        logs = args.out / f"logs{swap}"
        logs.mkdir(exist_ok=True)
        cores = [Workers(CpuBed(model="tiny", decode_core=str(c)), logs, prefix=f"c{c}-") for c in (0, 1)]
        try:
            started = [w.start(name, "decode", name) for w, name in zip(cores, names)]
            engines = {name: (w.ready(p), core) for core, (w, p, name) in enumerate(zip(cores, started, names))}
            for k, conv in enumerate(convs[swap * args.conversations : (swap + 1) * args.conversations]):
                for turn, prompt in enumerate(conv):
                    for name in ("hybrid", "none") if (k + turn) % 2 == 0 else ("none", "hybrid"):
                        engine, core = engines[name]
                        row = {"placement": swap, "conversation": k, "turn": turn, "setup": name, "core": core}
                        rows.append(row | one_request(engine.url, prompt))
                        log(json.dumps(rows[-1]))
        finally:
            for w in cores:
                w.close()
    pairs: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        pairs.setdefault((r["placement"], r["conversation"], r["turn"]), {})[r["setup"]] = r
    ratios: dict[str, list[float]] = {}
    for (_, _, turn), pair in pairs.items():
        if pair["none"]["prefill_ms"] > 0:
            ratio = pair["hybrid"]["prefill_ms"] / pair["none"]["prefill_ms"]
            ratios.setdefault(f"turn {turn}", []).append(ratio)
            ratios.setdefault("all", []).append(ratio)
    summary = {
        k: {"pairs": len(v), "median": round(statistics.median(v), 3), "min": round(min(v), 2), "max": round(max(v), 2)}
        for k, v in sorted(ratios.items())
    }
    (args.out / "results.json").write_text(json.dumps({"ours_over_none_prefill": summary, "rows": rows}, indent=1))
    log(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
