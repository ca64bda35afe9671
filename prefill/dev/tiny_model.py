"""Tiny hybrid models built locally: the demo's and the tests' models.

One per hybrid family (`tiny_families.py`; the default is Qwen3-Next: Gated DeltaNet linear-attention layers
interleaved with full-attention layers and a small MoE), with an offline byte-level BPE tokenizer and a ChatML
chat template. Nothing is downloaded.

Decided outputs: a random model's next-token distribution is nearly flat (its two best tokens are within
0.01 nats on ~10% of greedy steps), so two engines that round differently pick different tokens and an
output comparison stops at the first such near-tie. Each model is therefore trained briefly (`train_steps`,
about a minute on one CPU core) on an offline corpus whose next word is a fixed function of the last word and
the third last (a table drawn from the seed, with 15% random words so that any word sequence is in
distribution). Greedy continuations then win by several nats, far above bf16 rounding, and they depend on the
KV cache and the recurrent state of the prompt: where D computes the last two prompt tokens after a boundary
(tests/support/controls.py), the third last word of the first generated token lives only in what P shipped,
and every later word follows from that first one. Another seed gives another table and other weights (the
negative control of the output tests).

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
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # for annotations only: the launchers import this module, torch loads slowly
    import torch

CACHE_ROOT = Path(os.environ.get("HYBRID_PD_CACHE", Path.home() / ".cache" / "hybrid-pd"))
BUILD_VERSION = 6  # bump when the builder's output changes for the same spec

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
    family: str = "qwen3_next"  # a key of tiny_families.FAMILIES
    seed: int = 0
    layers: int = 4
    full_attention_interval: int = 2  # every Nth layer is full attention, the others recurrent
    hidden_size: int = 256
    vocab_size: int = 512
    dtype: str = "bfloat16"
    init_std: float = 0.02
    train_steps: int = 300  # 0: random weights (flat next-token distributions)

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


class Corpus:
    """Word sequences whose next word is `table[third last][last]` (85%) or a random word (15%), drawn from `seed`.

    The third last word, not the second: D computes the last two prompt tokens after a boundary it resumes from,
    so the first word it answers depends on a word that only P's bytes carry (its KV and the recurrent or
    convolution state at the boundary), and every later word on that first one."""

    NOISE = 0.15

    def __init__(self, seed: int):
        import random

        self.words = sorted(set(WORDS))
        self.rng = random.Random(f"corpus-{seed}")
        n = len(self.words)
        self.table = [[self.rng.randrange(n) for _ in range(n)] for _ in range(n)]

    def document(self, n_words: int) -> str:
        n, rng = len(self.words), self.rng
        out = [rng.randrange(n), rng.randrange(n), rng.randrange(n)]
        while len(out) < n_words:
            out.append(rng.randrange(n) if rng.random() < self.NOISE else self.table[out[-3]][out[-1]])
        return " " + " ".join(self.words[i] for i in out)


def _train(model: torch.nn.Module, tokenizer_dir: Path, spec: TinyModelSpec, batch: int = 8, seq: int = 128) -> None:
    """A brief next-token training on `Corpus(seed)`: sharp, context-dependent greedy outputs."""
    import torch
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    corpus = Corpus(spec.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    device = next(model.parameters()).device
    model.train()
    for _ in range(spec.train_steps):
        rows = [tok(corpus.document(seq), add_special_tokens=False)["input_ids"][:seq] for _ in range(batch)]
        width = min(map(len, rows))
        ids = torch.tensor([r[:width] for r in rows], device=device)
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    model.eval()


def _build_weights(spec: TinyModelSpec, vocab: int, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from hybrid_pd.prefill.dev.tiny_families import FAMILIES, LAYOUTS

    cfg = FAMILIES[spec.family](spec, vocab)
    threads = torch.get_num_threads()
    torch.manual_seed(spec.seed)
    torch.set_num_threads(1)  # the same bytes on every run of this machine, whatever else runs beside it
    try:
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        if spec.train_steps:  # on a GPU machine (the GPU checks build their models there): seconds, not a minute
            _train(model.to("cuda" if torch.cuda.is_available() else "cpu"), out, spec)
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
