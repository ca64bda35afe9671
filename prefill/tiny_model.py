"""A tiny hybrid model built locally: the demo's and the tests' default model.

Qwen3-Next layout (vLLM's `Qwen3NextForCausalLM`): Gated DeltaNet linear-attention layers interleaved with
full-attention layers, a small MoE MLP in every layer (vLLM's implementation needs at least one MoE layer),
random weights drawn from a seed, and an offline byte-level BPE tokenizer with a ChatML chat template.
Nothing is downloaded. The build is deterministic: the same (seed, spec) gives the same bytes, and the folder
is cached on disk under a name derived from both, so every process finds the same model.

    python -m hybrid_pd.prefill.tiny_model [--seed N] [--out DIR]   # prints the model folder
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import io
import json
import os
from pathlib import Path

CACHE_ROOT = Path(os.environ.get("HYBRID_PD_CACHE", Path.home() / ".cache" / "hybrid-pd"))
BUILD_VERSION = 1  # bump when the builder's output changes for the same spec

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
WORDS = (
    "the quick brown fox jumps over the lazy dog prefix cache mamba state attention block token decode "
    "prefill engine server request model hello world one two three four five six seven eight nine ten "
    "user assistant system you are a helpful agent tool call result turn conversation"
).split()


@dataclasses.dataclass(frozen=True)
class TinyModelSpec:
    seed: int = 0
    layers: int = 4
    full_attention_interval: int = 2  # every Nth layer is full attention, the others GDN
    hidden_size: int = 256
    vocab_size: int = 512
    dtype: str = "bfloat16"
    init_std: float = 0.02

    def folder_name(self) -> str:
        key = json.dumps(dataclasses.asdict(self) | {"v": BUILD_VERSION}, sort_keys=True)
        return f"tiny-qwen3next-s{self.seed}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def _corpus() -> list[str]:
    with contextlib.redirect_stdout(io.StringIO()):
        import this  # noqa: F401  (the Zen of Python: a fixed English text that ships with Python)
    import codecs

    zen = codecs.decode(this.s, "rot13")
    phrases = [" ".join(WORDS[(k * 7 + i) % len(WORDS)] for i in range(40)) for k in range(200)]
    return [zen] * 4 + phrases


def _build_tokenizer(spec: TinyModelSpec, out: Path) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    hf_tok.model_max_length = 4096
    hf_tok.chat_template = CHAT_TEMPLATE
    hf_tok.save_pretrained(out)
    return tok.get_vocab_size()


def _build_weights(spec: TinyModelSpec, vocab: int, out: Path) -> None:
    import torch
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    layer_types = [
        "full_attention" if (i + 1) % spec.full_attention_interval == 0 else "linear_attention"
        for i in range(spec.layers)
    ]
    cfg = Qwen3NextConfig(
        vocab_size=vocab,
        hidden_size=spec.hidden_size,
        intermediate_size=2 * spec.hidden_size,
        num_hidden_layers=spec.layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=64,
        linear_value_head_dim=64,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        layer_types=layer_types,
        max_position_embeddings=4096,
        initializer_range=spec.init_std,
        tie_word_embeddings=False,
        eos_token_id=0,
        pad_token_id=0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=128,
        shared_expert_intermediate_size=128,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        norm_topk_prob=True,
    )
    cfg.architectures = ["Qwen3NextForCausalLM"]
    torch.manual_seed(spec.seed)
    model = Qwen3NextForCausalLM(cfg).to(getattr(torch, spec.dtype))
    model.save_pretrained(out)


def build_tiny_model(spec: TinyModelSpec = TinyModelSpec(), out: Path | None = None) -> Path:
    """Return the folder of the model for `spec`, building it first if it is not cached yet."""
    out = Path(out) if out else CACHE_ROOT / "models" / spec.folder_name()
    marker = out / "hybrid-pd-model.json"
    if marker.exists():
        return out
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    vocab = _build_tokenizer(spec, tmp)
    _build_weights(spec, vocab, tmp)
    (tmp / "hybrid-pd-model.json").write_text(json.dumps(dataclasses.asdict(spec), indent=1))
    try:
        tmp.rename(out)  # atomic: concurrent builders of the same spec race harmlessly
    except OSError:
        if not marker.exists():
            raise
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0, help="weight seed (another seed = another model)")
    ap.add_argument("--out", type=Path, default=None, help="folder to write (default: the cache)")
    args = ap.parse_args(argv)
    print(build_tiny_model(TinyModelSpec(seed=args.seed), args.out))


if __name__ == "__main__":
    main()
