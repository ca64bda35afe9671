"""The proxy's own CPU on a long prompt's request, piece by piece, in one process (no HTTP): what a turn of the GPU
benchmark's sizes (4-9k token ids per prompt, 32k for long contexts) costs the proxy before and after it talks to
a worker. On two H100s the proxy added 1.22 ms to a turn D served alone (merge.py proxy_added_ms_p50,
2026-11-27-h100x2-qwen3next-judged-vllm033-r3).

    python -m benchmarks.proxy_parse [--sizes 1024,9181,32768] [--reps 200] [--out DIR]

Per prompt size, microseconds (median of --reps after one untimed call):
- parse: openai_api.parse_request of a completions body whose prompt is token ids (JSON decode, the field checks,
  the token ids taken as a list);
- ids check, generator / msgspec: the element check alone, as a Python generator (isinstance per element, the proxy
  until 2026-11-27) and as msgspec.convert(list[int], strict) (the proxy since);
- keys cold / warm: the prompt's block keys (kv/prompt_keys.py, vLLM's chained sha256 at 16-token blocks) with an
  empty ChainCache, then with the one that has the prompt (an agent's next turn repeats its last prompt);
- body out: the decoder's body (decode_body) encoded to JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from hybrid_pd.proxy.kv.prompt_keys import ChainCache, PromptKeys
from hybrid_pd.proxy.openai_api import parse_request


def median_us(f: Callable[[], Any], reps: int) -> float:
    f()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return round(statistics.median(times) * 1e6, 1)


def generator_check(x: Any) -> bool:
    """The proxy's element check until 2026-11-27 (openai_api._is_token_list)."""
    return isinstance(x, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in x)


def msgspec_check(x: Any) -> bool:
    try:
        msgspec.convert(x, list[int], strict=True)
    except msgspec.ValidationError:
        return False
    return True


def measure(size: int, reps: int) -> dict:
    rng = random.Random(size)
    ids = [rng.randrange(151_000) for _ in range(size)]
    raw = msgspec.json.encode({"model": "m", "prompt": ids, "max_tokens": 64, "temperature": 0, "stream": True})
    request = parse_request("completions", raw)
    encoder = msgspec.json.Encoder()

    def keys(cache: ChainCache) -> list[int]:
        return PromptKeys(ids, 16, "sha256", "0", None, cache).upto(size)

    warm = ChainCache()
    keys(warm)
    return {
        "tokens": size,
        "body_bytes": len(raw),
        "parse_us": median_us(lambda: parse_request("completions", raw), reps),
        "ids_check_generator_us": median_us(lambda: generator_check(ids), reps),
        "ids_check_msgspec_us": median_us(lambda: msgspec_check(ids), reps),
        "keys_cold_us": median_us(lambda: keys(ChainCache()), max(reps // 4, 5)),
        "keys_warm_us": median_us(lambda: keys(warm), reps),
        "body_out_us": median_us(lambda: encoder.encode(request.decode_body(None, True)), reps),
    }


def table(rows: list[dict]) -> str:
    cols = list(rows[0])
    out = ["| " + " | ".join(c.replace("_", " ") for c in cols) + " |", "|---" * len(cols) + "|"]
    out += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1024,9181,32768")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    rows = [measure(int(s), args.reps) for s in args.sizes.split(",")]
    text = table(rows)
    print(text, end="")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "proxy_parse.md").write_text(text)
        (args.out / "results.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
