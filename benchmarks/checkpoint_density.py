"""How dense should Mamba checkpoints be? Prefix hits against the oracle, and what denser checkpoints cost in
prefill speed, for `--checkpoint-every` off and at 1, 2 and 4 aligned blocks (256 tokens each on the CPU bed).

Hits come from the benchmark harness, run once per setting beforehand (colocated and hybrid-pd 1P1D, the same
21 requests of the agentic, shared-system, insert-in-the-middle and single workloads):

    for n in 0 256 512 1024; do bash deploy/dev.sh bench --setups colocated,hybrid-pd-1p1d \\
        --worker-args "--checkpoint-every $n" --out benchmarks/results/<date>-cpu-checkpoint-density/every-$n; done

(no --worker-args for 0). This script then measures prefill speed on one colocated engine per setting (fresh
prompts of 1,920 tokens, nothing cached, max_tokens=1, so the answer's time is the prompt's prefill) and writes
the table:

    bash deploy/dev.sh run python -m benchmarks.checkpoint_density [--prompts 8]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.client import post_json
from benchmarks.naming import results_dir
from benchmarks.setups import CpuBed, Setup, running
from benchmarks.workloads import Tokens
from hybrid_pd.prefill.dev.tiny_model import build_tiny_model

OUT = results_dir("cpu", "checkpoint-density")
SETTINGS = (0, 256, 512, 1024)
PROMPT_TOKENS = 1920  # under the bed's --max-model-len 2048


def prefill_seconds(url: str, prompts: list[tuple[int, ...]]) -> list[float]:
    out = []
    for ids in prompts:
        start = time.monotonic()
        post_json(url + "/v1/completions", {"model": "tiny", "prompt": list(ids), "max_tokens": 1})
        out.append(time.monotonic() - start)
    return out


def hits(every: int) -> dict[str, float]:
    path = OUT / f"every-{every}" / "results.json"
    if not path.exists():
        return {}
    res = json.loads(path.read_text())
    oracle = sum(r["oracle_hit"] for r in res["setups"]["colocated"]["requests"])
    return {name: sum(r["hit_tokens"] for r in s["requests"]) / oracle for name, s in res["setups"].items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--settings", default=",".join(map(str, SETTINGS)), help="--checkpoint-every values (0: off)")
    args = ap.parse_args()
    model = str(build_tiny_model())
    tokens = Tokens(model)
    rng = random.Random(7)
    logs = Path(tempfile.mkdtemp(prefix="density-"))
    rows = []
    for every in map(int, args.settings.split(",")):
        bed = CpuBed(model, extra=("--checkpoint-every", str(every)) if every else ())
        prompts = [tokens.sized(rng, PROMPT_TOKENS) for _ in range(args.prompts + 1)]  # fresh for every setting
        with running(Setup("colocated", bed, logs)) as setup:
            prefill_seconds(setup.front.url, prompts[:1])  # warm-up
            secs = prefill_seconds(setup.front.url, prompts[1:])
        p50 = statistics.median(secs)
        rows.append({"checkpoint_every": every, "prefill_s_p50": round(p50, 3),
                     "prefill_tok_s": round(PROMPT_TOKENS / p50), "hits_vs_oracle": hits(every)})
        print(rows[-1], flush=True)
    base = rows[0]["prefill_s_p50"]
    lines = ["# Checkpoint density (CPU bed, tiny model, aligned block 256 tokens)", "",
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; commands in benchmarks/checkpoint_density.py. "
             f"Prefill: median of {args.prompts} fresh {PROMPT_TOKENS}-token prompts on one colocated engine.", "",
             "| --checkpoint-every | hits / oracle, colocated | hits / oracle, hybrid-pd 1P1D | prefill s (p50) | "
             "prefill tok/s | prefill time vs off |", "|---|---|---|---|---|---|"]
    for r in rows:
        h = r["hits_vs_oracle"]
        lines.append(f"| {r['checkpoint_every'] or 'off'} | {h.get('colocated', float('nan')):.3f} | "
                     f"{h.get('hybrid-pd-1p1d', float('nan')):.3f} | {r['prefill_s_p50']} | {r['prefill_tok_s']} | "
                     f"{r['prefill_s_p50'] / base:.2f}x |")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "results.json").write_text(json.dumps(rows, indent=1))
    (OUT / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
