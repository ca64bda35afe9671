"""Does vLLM compute a tiny model as transformers does? The same built model (a folder of prefill/dev/tiny_model.py),
the controls' prompts (random words, a key word among the first 100), 8 greedy tokens: each forward's tokens and
top-1 log-probabilities, and transformers' with noise in the last attention block before the boundary
(benchmarks/tiny_attention_probe.py's scramble). Where the two forwards differ, a control measured in one says
nothing of the other. To find where they part: the log-probability of every prompt token (vLLM's prompt_logprobs:
its prefill) against transformers', `--ssm-cache-dtype float32` (vLLM keeps the recurrent state in the model's dtype
by default: a decay of exp(-1e-3 dt), the tiny models' slow heads, rounds to 1 in bf16) and `--reference-scan`
(vLLM's Mamba1 selective-scan kernels replaced by plain torch, in this process). On one H100 (2026-11-27) every
prompt token of the tiny Jamba came within 0.023 nats all three ways: the greedy tokens that differed were
transformers', whose Jamba continued a chunked tail from a zero state (tiny_attention_probe.answer now feeds it one
token at a time).

    python3 -m benchmarks.tiny_vllm_vs_transformers MODEL_FOLDER --block 48 [--ssm-cache-dtype float32]
        [--reference-scan] [--out FILE]
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


def reference_scan() -> None:
    """vLLM's Mamba1 prefill scan and decode state update, as plain torch (mamba_ssm's selective_scan_ref), patched
    into vLLM's MambaMixer: where vLLM then agrees with transformers, its kernels were the difference."""
    import torch
    import torch.nn.functional as F
    import vllm.model_executor.layers.mamba.mamba_mixer as mixer

    def scan(
        u,
        ssm_states,
        delta,
        A,
        B,
        C,
        D=None,
        z=None,
        delta_bias=None,
        delta_softplus=False,
        query_start_loc=None,
        cache_indices=None,
        has_initial_state=None,
        **_,
    ):
        B, C = (B if B.dim() == 3 else B[None]), (C if C.dim() == 3 else C[None])
        out, starts = torch.empty_like(u), query_start_loc.tolist()
        for s in range(len(starts) - 1):
            a, b = starts[s], starts[s + 1]
            slot = int(cache_indices[s] if cache_indices.dim() == 1 else cache_indices[s, 0])
            dt = delta[:, a:b].float() + (delta_bias.float()[:, None] if delta_bias is not None else 0)
            dt = F.softplus(dt) if delta_softplus else dt
            warm = has_initial_state is not None and bool(has_initial_state[s])
            state = ssm_states[slot].float().clone() if warm else torch.zeros(A.shape, device=u.device)
            x, ys = u[:, a:b].float(), []
            for t in range(b - a):
                state = (
                    torch.exp(dt[:, t, None] * A.float()) * state
                    + dt[:, t, None] * B[0, None, :, a + t].float() * x[:, t, None]
                )
                ys.append(state @ C[0, :, a + t].float())
            y = torch.stack(ys, -1) + (x * D.float()[:, None] if D is not None else 0)
            out[:, a:b] = (y * F.silu(z[:, a:b].float()) if z is not None else y).to(out.dtype)
            ssm_states[slot] = state.to(ssm_states.dtype)
        target = z if z is not None else delta
        target.copy_(out)
        return target

    def update(state, x, dt, A, B, C, D, dt_bias, z=None, dt_softplus=False, state_batch_indices=None, out=None, **_):
        for i, slot in enumerate(state_batch_indices.reshape(-1).tolist()):
            d = dt[i].float() + (dt_bias.float() if dt_bias is not None else 0)
            d = F.softplus(d) if dt_softplus else d
            s = (
                torch.exp(d[:, None] * A.float()) * state[slot].float()
                + d[:, None] * B[i].float()[None] * x[i].float()[:, None]
            )
            y = s @ C[i].float() + x[i].float() * D.float()
            out[i] = (y * F.silu(z[i].float()) if z is not None else y).to(out.dtype)
            state[slot] = s.to(state.dtype)

    mixer.selective_scan_fn, mixer.selective_state_update = scan, update


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--block", type=int, required=True)
    ap.add_argument("--ssm-cache-dtype", default=None, help="vLLM's --mamba-ssm-cache-dtype (default: the model's)")
    ap.add_argument("--reference-scan", action="store_true", help="vLLM's Mamba1 scan kernels in plain torch")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.reference_scan:
        import os

        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process, patched
        reference_scan()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from benchmarks.tiny_attention_probe import answer, scramble

    tok = AutoTokenizer.from_pretrained(args.model)
    boundary = -(-299 // args.block) * args.block
    ids_list = prompts(tok, boundary + 2)
    hf = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).to("cuda").eval()
    rows = []
    for ids in ids_list:
        with torch.no_grad():
            lp = torch.log_softmax(hf(input_ids=torch.tensor([ids], device="cuda")).logits[0].float(), -1)
        prompt_lp = [float(lp[i, ids[i + 1]]) for i in range(len(ids) - 1)]
        tokens, lps = answer(hf, ids, boundary)
        _, scrambled = answer(hf, ids, boundary, scramble(boundary - args.block, boundary), tokens)
        rows.append(
            {
                "hf_tokens": tokens,
                "hf_logprobs": [round(x, 3) for x in lps],
                "hf_prompt": prompt_lp,
                "hf_scramble_move": round(max(abs(a - b) for a, b in zip(lps, scrambled)), 3),
            }
        )
    del hf
    torch.cuda.empty_cache()
    from vllm import LLM, SamplingParams

    extra = {"mamba_ssm_cache_dtype": args.ssm_cache_dtype} if args.ssm_cache_dtype else {}
    llm = LLM(
        model=str(args.model),
        dtype="bfloat16",
        enforce_eager=True,
        gpu_memory_utilization=0.15,
        max_model_len=2048,
        enable_prefix_caching=False,
        **extra,
    )
    params = SamplingParams(temperature=0.0, max_tokens=8, logprobs=1, ignore_eos=True, prompt_logprobs=0)
    outs = llm.generate([{"prompt_token_ids": ids} for ids in ids_list], params)
    for row, out in zip(rows, outs):
        comp = out.outputs[0]
        row["vllm_tokens"] = list(comp.token_ids)
        row["vllm_logprobs"] = [round(lp[t].logprob, 3) for t, lp in zip(comp.token_ids, comp.logprobs)]
        row["same_tokens"] = row["vllm_tokens"] == row["hf_tokens"]
        ids = out.prompt_token_ids
        vllm_prompt = [d[ids[i]].logprob for i, d in enumerate(out.prompt_logprobs) if d is not None]
        gaps = [abs(a - b) for a, b in zip(row.pop("hf_prompt"), vllm_prompt)]
        row["prompt_max_delta"] = round(max(gaps), 3)
        row["prompt_first_over_0_1"] = next((i + 1 for i, g in enumerate(gaps) if g > 0.1), None)
    text = json.dumps(
        {
            "model": str(args.model),
            "block": args.block,
            "boundary": boundary,
            "ssm_cache_dtype": args.ssm_cache_dtype,
            "reference_scan": args.reference_scan,
            "rows": rows,
        },
        indent=1,
    )
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    sys.exit(main())
