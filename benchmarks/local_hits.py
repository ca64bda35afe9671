"""Does an engine keep the checkpoint at the last aligned boundary of a prompt it computed itself? The next turn of
a conversation (the prompt, the engine's answer, more words) should hit that boundary: it is what a decoder that
served a turn alone serves the next one from.

    bash deploy/dev.sh run python -m benchmarks.local_hits --family qwen3_next --block 256 \
        [--lengths 300,350,400,500,523,700,963] [--out FILE.jsonl] [-- LAUNCHER FLAGS [-- VLLM FLAGS]]

One plain engine of the tiny model (no connector, as `hybrid-pd decode --connector none` starts it on the CPU bed),
per prompt length n: a fresh prompt of n tokens (8 tokens answered), then the next turn (the prompt, the answer and
23 more tokens), then the prompt again. Per length: the boundary the next turn can hit at best
((n - 1) // block * block: the prompt's last aligned boundary) against the cached tokens the engine reports for
the next turn and for the prompt again.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from benchmarks.procs import Launched, free_port
from hybrid_pd.prefill.dev.tiny_families import FAMILY_VLLM_ARGS
from hybrid_pd.prefill.dev.tiny_model import TinyModelSpec, build_tiny_model
from tests.support.conversation import cached, complete, text_of, tokenize
from tests.support.procs import worker_argv


def one_length(url: str, n: int, block: int, salt: int) -> dict:
    ids = tokenize(url, text_of(2 * n, salt))[:n]
    more = tokenize(url, " " + text_of(30, salt + 900))[:23]
    first = complete(url, ids, 8, return_token_ids=True)
    nxt = ids + first["choices"][0]["token_ids"] + more
    return {"n": n, "last_boundary": (n - 1) // block * block, "next_tokens": len(nxt),
            "next_cached": cached(complete(url, nxt, 8)), "again_cached": cached(complete(url, ids, 1))}


@contextmanager
def plain_engine(family: str, name: str, logs: Path, extra: list[str]) -> Iterator[str]:
    """One engine of the tiny `family` without a connector, as the CPU bed's tests start it (`extra`: launcher flags,
    then optionally "--" and vLLM flags): its URL while the block runs."""
    model = str(build_tiny_model(TinyModelSpec(family=family)))
    if FAMILY_VLLM_ARGS.get(family):
        extra = extra + ([] if "--" in extra else ["--"]) + list(FAMILY_VLLM_ARGS[family])
    port = free_port()
    command = worker_argv("decode", connector="none", port=port, cpu_bind="1", model=model, extra=extra)
    engine = Launched(name, command, f"http://127.0.0.1:{port}", logs)
    try:
        engine.wait_healthy(300)
        yield engine.url
    finally:
        engine.stop()


def emit(rows: list[dict], out: Path | None) -> None:
    """Print each row as a JSON line, and append it to `out`."""
    for row in rows:
        line = json.dumps(row)
        print(line, flush=True)
        if out:
            with out.open("a") as f:
                f.write(line + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", default="qwen3_next")
    ap.add_argument("--block", type=int, required=True, help="the family's aligned block on this bed")
    ap.add_argument("--lengths", default="300,350,400,500,523,700,963")
    ap.add_argument("--out", type=Path, default=None, help="append one JSON row per length")
    ap.add_argument("--logs", type=Path, default=Path("/tmp"))
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args, extra = ap.parse_args(argv[:cut]), argv[cut + 1 :]  # launcher flags, then optionally "--" and vLLM flags
    with plain_engine(args.family, f"local-hits-{args.family}", args.logs, extra) as url:
        rows = [one_length(url, int(n), args.block, salt) for salt, n in enumerate(args.lengths.split(","), start=1)]
    emit([{"family": args.family, "flags": " ".join(extra), **row} for row in rows], args.out)


if __name__ == "__main__":
    main()
