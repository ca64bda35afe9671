"""Tiny hybrid models built locally: the demo's and the tests' models.

One per hybrid family (`tiny_families.py`; the default is Qwen3-Next: Gated DeltaNet linear-attention layers
interleaved with full-attention layers and a small MoE), with an offline byte-level BPE tokenizer and a ChatML
chat template. Nothing is downloaded.

Decided outputs: a random model's next-token distribution is nearly flat (its two best tokens are within
0.01 nats on ~10% of greedy steps), so two engines that round differently pick different tokens and an
output comparison stops at the first such near-tie. Each model is therefore trained briefly (`train_steps`,
a few minutes on one CPU core) on an offline corpus (`tiny_training.py`) whose next word is a seed-drawn function
of the last word, the third last and a key word sprinkled among the first words, with 15% random words so that any
word sequence is in distribution. Greedy continuations then win by nats, far above bf16 rounding, and they depend
on the KV cache and the recurrent state of the prompt twice over: the third last word lives only in what P shipped
when D computes the last two prompt tokens after a boundary, and the key word only in the recurrent state at the
boundary when D computes a long tail (tests/support/controls.py). Another seed gives another rule and other
weights (the negative control of the output tests).

The build is deterministic on a given machine (fixed seeds and thread count): the same spec gives the same
bytes, and the folder is cached on disk under a name derived from the spec, so every process finds the same
model.

    python -m hybrid_pd.prefill.dev.tiny_model [--family F] [--seed N] [--out DIR]   # prints the model folder
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

from hybrid_pd.prefill.dev.tiny_training import KEYS, WORDS, train

CACHE_ROOT = Path(os.environ.get("HYBRID_PD_CACHE", Path.home() / ".cache" / "hybrid-pd"))
BUILD_VERSION = 9  # bump when the builder's output changes for the same spec

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


@dataclasses.dataclass(frozen=True)
class TinyModelSpec:
    family: str = "qwen3_next"  # a key of tiny_families.FAMILIES
    seed: int = 0
    layers: int = 4
    full_attention_interval: int = 2  # every Nth layer is full attention, the others recurrent
    hidden_size: int = 256
    vocab_size: int = 512
    dtype: str = "bfloat16"
    init_std: float = 0.02
    train_steps: int = 350  # 0: random weights (flat next-token distributions)

    def folder_name(self) -> str:
        from hybrid_pd.prefill.dev.tiny_families import FAMILY_REVISION

        revision = FAMILY_REVISION.get(self.family, 0)  # in the key only once bumped: other families keep theirs
        key = json.dumps(
            dataclasses.asdict(self) | {"v": BUILD_VERSION} | ({"rev": revision} if revision else {}), sort_keys=True
        )
        name = self.family.replace("_", "")
        return f"tiny-{name}-s{self.seed}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def _corpus() -> list[str]:
    with contextlib.redirect_stdout(io.StringIO()):
        import this  # noqa: F401  (the Zen of Python: a fixed English text that ships with Python)
    import codecs

    zen = codecs.decode(this.s, "rot13")
    words = WORDS + list(KEYS)
    phrases = [" ".join(words[(k * 7 + i) % len(words)] for i in range(40)) for k in range(200)]
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
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hybrid_pd.prefill.dev.tiny_families import FAMILIES, FAMILY_TRAINING, LAYOUTS, Training

    cfg = FAMILIES[spec.family](spec, vocab)
    recipe = FAMILY_TRAINING.get(spec.family, Training())
    threads = torch.get_num_threads()
    torch.manual_seed(spec.seed)
    torch.set_num_threads(1)  # the same bytes on every run of this machine, whatever else runs beside it
    try:
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        if spec.train_steps:  # on a GPU machine (the GPU checks build their models there): seconds, not minutes
            tok = AutoTokenizer.from_pretrained(out)
            model.to("cuda" if torch.cuda.is_available() else "cpu")
            steps, blind_steps = recipe.steps(spec.train_steps), recipe.blind_steps(spec.train_steps)
            train(model, tok, spec.seed, steps, blind=recipe.blind, blind_steps=blind_steps)
    finally:
        torch.set_num_threads(threads)
    model.to("cpu", getattr(torch, spec.dtype)).save_pretrained(out)
    if spec.family in LAYOUTS:
        LAYOUTS[spec.family](out)


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
    ap.add_argument("--family", default="qwen3_next", help="hybrid family (tiny_families.FAMILIES)")
    ap.add_argument("--seed", type=int, default=0, help="weight seed (another seed = another model)")
    ap.add_argument("--out", type=Path, default=None, help="folder to write (default: the cache)")
    args = ap.parse_args(argv)
    print(build_tiny_model(TinyModelSpec(family=args.family, seed=args.seed), args.out))


if __name__ == "__main__":
    main()
