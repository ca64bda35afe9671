"""Real-shape hybrid models with random weights, built on the GPU machine (nothing downloaded).

Per-layer shapes come from the published config.json of each model; only what does not change the KV or
state bytes per token, nor the layer pattern's period, is reduced, so that a prefill worker, a decode worker
and a colocated engine fit on one GPU (about 0.28 of an H100's memory each):

- `qwen3next`: Qwen3-Next-80B-A3B (Qwen3NextForCausalLM; config.json of
  https://huggingface.co/Qwen/Qwen3-Next-80B-A3B-Instruct, whose values transformers' Qwen3NextConfig
  defaults mirror: hidden 2048, 16 attention heads, 2 KV heads of dim 256, Gated DeltaNet with 16 key heads
  and 32 value heads of dim 128, conv kernel 4, one full-attention layer in 4, MoE of 512 experts, 10 routed
  + 1 shared, expert width 512, rope theta 1e7 on a quarter of the head). Kept: every per-layer shape,
  top-10 routing and the expert width. Reduced: 48 -> 12 layers (3 periods of 3 GDN + 1 attention),
  512 -> 16 experts, vocabulary (the tiny model's tokenizer).
- `nemotronh`: Nemotron-H-8B (NemotronHForCausalLM; the defaults of vLLM's and transformers' NemotronHConfig,
  "similar to NemotronH-v0.1", https://docs.vllm.ai/en/v0.20.2/api/vllm/transformers_utils/configs/nemotron_h/,
  and the 8B row of Megatron-Bridge's docs/models/llm/nemotronh.md: hidden 4096, 52 layers
  `M-M-M-M*-M-M-M-M-M*-...`, 32 attention heads, 8 KV heads of dim 128, Mamba2 with 128 heads of dim 64,
  state 128, 8 groups, conv kernel 4, relu2 MLP of width 21504). Kept: every per-layer shape. Reduced:
  52 -> 20 layers (the pattern's first two periods, `M-M-M-M*-M-M-M-M-M*-`: 9 Mamba2, 9 MLP, 2 attention),
  vocabulary.

Weights are drawn on the GPU in bf16 from a seed (same seed, same GPU kind: same bytes). The tokenizer is the
tiny model's offline byte-level BPE (prefill/dev/tiny_model.py); the model's vocabulary is padded to 1024 rows.

    python3 benchmarks/gpu/real_shapes.py qwen3next OUT_DIR [--seed 0] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

VOCAB = 1024  # rows of the embedding: the tiny tokenizer's ~512 tokens, padded

QWEN3_NEXT = dict(  # Qwen/Qwen3-Next-80B-A3B-Instruct config.json, reduced where the docstring says
    hidden_size=2048, num_attention_heads=16, num_key_value_heads=2, head_dim=256,
    linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
    linear_conv_kernel_dim=4, full_attention_interval=4, intermediate_size=5120,
    num_experts=16, num_experts_per_tok=10, moe_intermediate_size=512, shared_expert_intermediate_size=512,
    decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True, rms_norm_eps=1e-6, hidden_act="silu",
    max_position_embeddings=65536, tie_word_embeddings=False, num_hidden_layers=12,
    rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
)
NEMOTRON_H_PATTERN = "M-M-M-M*-M-M-M-M-M*-"  # first 20 of Nemotron-H-8B's 52 layers
NEMOTRON_H = dict(  # Nemotron-H-8B (NemotronH-v0.1 defaults), reduced where the docstring says
    hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128, intermediate_size=21504,
    mamba_num_heads=128, mamba_head_dim=64, ssm_state_size=128, n_groups=8, conv_kernel=4, chunk_size=128,
    mlp_hidden_act="relu2", use_conv_bias=True, use_bias=False, mamba_hidden_act="silu", layer_norm_epsilon=1e-5,
    residual_in_fp32=False, max_position_embeddings=65536, tie_word_embeddings=False,
    num_hidden_layers=len(NEMOTRON_H_PATTERN), hybrid_override_pattern=NEMOTRON_H_PATTERN,
)


def qwen3next_config():
    from transformers import Qwen3NextConfig

    kw = dict(QWEN3_NEXT)
    n, every = kw["num_hidden_layers"], kw.pop("full_attention_interval")
    kw["layer_types"] = ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(n)]
    cfg = Qwen3NextConfig(vocab_size=VOCAB, eos_token_id=0, pad_token_id=0, bos_token_id=0, initializer_range=0.02,
                          **kw)
    cfg.architectures = ["Qwen3NextForCausalLM"]
    return cfg


def nemotronh_config():
    from transformers import NemotronHConfig

    kw = dict(NEMOTRON_H)
    cfg = NemotronHConfig(vocab_size=VOCAB, eos_token_id=0, pad_token_id=0, bos_token_id=0, initializer_range=0.02,
                          **kw)
    cfg.architectures = ["NemotronHForCausalLM"]
    return cfg


KINDS = {"qwen3next": (qwen3next_config, "Qwen3NextForCausalLM"),
         "nemotronh": (nemotronh_config, "NemotronHForCausalLM")}


def state_bytes_per_token(cfg) -> dict:
    """Attention KV bytes per token and recurrent state bytes per sequence (bf16), all layers."""
    if cfg.model_type == "qwen3_next":
        attn = sum(t == "full_attention" for t in cfg.layer_types)
        lin = len(cfg.layer_types) - attn
        conv_dim = 2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim + \
            cfg.linear_num_value_heads * cfg.linear_value_head_dim
        state = (cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim +
                 (cfg.linear_conv_kernel_dim - 1) * conv_dim) * 2
    else:
        pattern = cfg.hybrid_override_pattern
        attn, lin = pattern.count("*"), pattern.count("M")
        conv_dim = cfg.mamba_num_heads * cfg.mamba_head_dim + 2 * cfg.n_groups * cfg.ssm_state_size
        state = (cfg.mamba_num_heads * cfg.mamba_head_dim * cfg.ssm_state_size + (cfg.conv_kernel - 1) * conv_dim) * 2
    kv = 2 * cfg.num_key_value_heads * cfg.head_dim * 2
    return {"attention_layers": attn, "state_layers": lin, "kv_bytes_per_token_per_layer": kv,
            "kv_bytes_per_token": kv * attn, "state_bytes_per_layer": state, "state_bytes": state * lin}


def build(kind: str, out: Path, seed: int = 0, device: str = "cuda") -> Path:
    """Write config, random bf16 weights and the tiny tokenizer into `out` (skipped if already complete)."""
    import torch
    import transformers

    from hybrid_pd.prefill.dev.tiny_model import TinyModelSpec, _build_tokenizer

    marker = out / "hybrid-pd-model.json"
    if marker.exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    make_cfg, arch = KINDS[kind]
    cfg = make_cfg()
    t0 = time.monotonic()
    _build_tokenizer(TinyModelSpec(vocab_size=512), out)
    tok_cfg = out / "tokenizer_config.json"
    tc = json.loads(tok_cfg.read_text())
    tc["model_max_length"] = cfg.max_position_embeddings
    tok_cfg.write_text(json.dumps(tc, indent=1))
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed) if device == "cuda" else None
    model_cls = getattr(transformers, arch)
    with torch.device(device):
        prev = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)
        try:
            model = model_cls(cfg)
        finally:
            torch.set_default_dtype(prev)
    model = model.to(torch.bfloat16)
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(out)
    if kind == "nemotronh":  # vLLM's own NemotronHConfig reads the pattern string, which transformers 5 drops
        cfg_path = out / "config.json"
        saved = json.loads(cfg_path.read_text())
        saved["hybrid_override_pattern"] = NEMOTRON_H_PATTERN
        cfg_path.write_text(json.dumps(saved, indent=1))
    info = {"kind": kind, "seed": seed, "architecture": arch, "params": params,
            "build_seconds": round(time.monotonic() - t0, 1), "transformers": transformers.__version__,
            **state_bytes_per_token(cfg)}
    marker.write_text(json.dumps(info, indent=1))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kind", choices=sorted(KINDS))
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--config-only", action="store_true", help="print the config and state sizes, build nothing")
    args = ap.parse_args(argv)
    if args.config_only:
        cfg = KINDS[args.kind][0]()
        print(json.dumps(state_bytes_per_token(cfg)))
        return
    out = build(args.kind, args.out, args.seed, args.device)
    print((out / "hybrid-pd-model.json").read_text())


if __name__ == "__main__":
    main()
