"""The first requests of a freshly started worker, with and without the launcher's warm-up (CPU bed).

    bash deploy/dev.sh run python -m benchmarks.first_request [--warmup none,1024]

For each --warmup-lengths value: one prefill launcher on the tiny Qwen3-Next model, its start-up time (command
to ready file, the warm-up included), then the same requests in the same order, each greedy and then with
log-probabilities (the sampler compiles kernels of its own on first use): a 1,200-token prompt, another, a
700-token prompt and the first one extended by 64 tokens (a prefix hit that starts from a cached state).
Figures: docs/benchmarks.md ("The warm-up").
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

from benchmarks.client import post_json
from benchmarks.setups import CpuBed, Workers
from hybrid_pd.prefill.dev.tiny_model import build_tiny_model
from hybrid_pd.prefill.launch.warmup import token_range

SAMPLERS = ({"temperature": 0}, {"temperature": 0, "logprobs": 2})


def probe(model: str, warmup: str, logs: Path) -> dict:
    workers = Workers(CpuBed(model, extra=("--warmup-lengths", warmup), prefill_core="0-1"), logs)
    worker = workers.start(f"first-{warmup}", "prefill", "none")
    out: dict = {"warmup": warmup, "rows": []}
    try:
        workers.ready(worker, 600)
        out["start_s"] = round(workers.start_s[worker.name] + workers.start_s[f"{worker.name} warm-up"], 1)
        lo, hi = token_range(model)
        rng = random.Random(5)
        first = [rng.randrange(lo, hi) for _ in range(1200)]
        prompts = [("1200", first), ("1200 (another)", [rng.randrange(lo, hi) for _ in range(1200)]),
                   ("700", [rng.randrange(lo, hi) for _ in range(700)]),
                   ("1200+64 (prefix hit)", first + [rng.randrange(lo, hi) for _ in range(64)])]
        for label, ids in prompts:
            for sampler in SAMPLERS:
                t = time.monotonic()
                post_json(worker.url + "/v1/completions",
                          {"model": "tiny", "prompt": ids, "max_tokens": 8, **sampler}, timeout=300)
                out["rows"].append({"prompt": label, "logprobs": "logprobs" in sampler,
                                    "seconds": round(time.monotonic() - t, 3)})
                print(json.dumps({"warmup": warmup, **out["rows"][-1]}), flush=True)
    finally:
        workers.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--warmup", default="none,1024",
                    help="the --warmup-lengths to compare, one launcher each (one length per launcher)")
    args = ap.parse_args()
    model = str(build_tiny_model())
    with tempfile.TemporaryDirectory(prefix="first-request-") as tmp:
        results = [probe(model, w, Path(tmp)) for w in args.warmup.split(",")]
    for r in results:
        print(f"--warmup-lengths {r['warmup']}: ready after {r.get('start_s')} s; "
              + "; ".join(f"{x['prompt']}{' +logprobs' if x['logprobs'] else ''} {x['seconds']:.2f} s"
                          for x in r["rows"]))


if __name__ == "__main__":
    main()
