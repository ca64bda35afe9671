"""Does vLLM compute a tiny model as transformers does? The same built model (a folder of prefill/dev/tiny_model.py),
the controls' prompts (random words, a key word among the first 100), 8 greedy tokens: each forward's tokens and
top-1 log-probabilities, and transformers' with noise in the last attention block before the boundary
(benchmarks/tiny_attention_probe.py's scramble). Where the two forwards differ, a control measured in one says
nothing of the other.

    python3 -m benchmarks.tiny_vllm_vs_transformers MODEL_FOLDER --block 48 [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path


def prompts(tok, n: int, count: int = 3) -> list[list[int]]:
    from hybrid_pd.prefill.dev.tiny_training import WORDS, keyed

    out = []
    for salt in range(11, 11 + count):
        rng = random.Random(salt)
        text = " ".join(keyed([rng.choice(WORDS) for _ in range(900)], salt % 3 + 1))
        out.append(tok(text, add_special_tokens=False)["input_ids"][:n])
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--block", type=int, required=True)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from benchmarks.tiny_attention_probe import answer, scramble

    tok = AutoTokenizer.from_pretrained(args.model)
    boundary = -(-299 // args.block) * args.block
    ids_list = prompts(tok, boundary + 2)
    hf = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).to("cuda").eval()
    rows = []
    for ids in ids_list:
        tokens, lps = answer(hf, ids, boundary)
        _, scrambled = answer(hf, ids, boundary, scramble(boundary - args.block, boundary), tokens)
        rows.append({"hf_tokens": tokens, "hf_logprobs": [round(x, 3) for x in lps],
                     "hf_scramble_move": round(max(abs(a - b) for a, b in zip(lps, scrambled)), 3)})
    del hf
    torch.cuda.empty_cache()
    from vllm import LLM, SamplingParams

    llm = LLM(model=str(args.model), dtype="bfloat16", enforce_eager=True, gpu_memory_utilization=0.15,
              max_model_len=2048, enable_prefix_caching=False)
    params = SamplingParams(temperature=0.0, max_tokens=8, logprobs=1, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": ids} for ids in ids_list], params)
    for row, out in zip(rows, outs):
        comp = out.outputs[0]
        row["vllm_tokens"] = list(comp.token_ids)
        row["vllm_logprobs"] = [round(lp[t].logprob, 3) for t, lp in zip(comp.token_ids, comp.logprobs)]
        row["same_tokens"] = row["vllm_tokens"] == row["hf_tokens"]
    text = json.dumps({"model": str(args.model), "block": args.block, "boundary": boundary, "rows": rows}, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    sys.exit(main())
