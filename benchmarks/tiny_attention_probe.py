"""How much a tiny family's answer rests on its attention blocks, in transformers (no vLLM): the scrambled-attention
control of tests/support/controls.py replayed on the model itself, to choose a training before a GPU run checks it.

Per family and variant (config overrides, e.g. `mamba_d_conv=2`; `drop=P`, the training's mixer drop, each mixer on
its own, or `dropall=P`, all at once; `blind=P`, that share of positions hidden from the mixers, in the steps from
`blind_from` to `blind_until` where given, every `blind_every`th of them; default none, as the builds but Zamba2's
(prefill/dev/tiny_families.py FAMILY_TRAINING: `blind=0.3,blind_from=1400` at 2,800 steps is its recipe); `seed=N`,
another seed than the builds' 0: the same recipe with its weights and corpus drawn again): build the tiny model as
prefill/dev/tiny_model.py does (same tokenizer, config, seed and training, on this machine's device), round it to
bf16 as it is served, then for prompts of the controls' shape (random words, a key word among the first 100) compute
the prefix to a boundary with a cache, spoil the cache, compute the tail (2 tokens: short; 150: long) and 8 greedy
tokens, and report how far the reference tokens' log-probabilities moved (max over positions, nats):

    scramble   noise 4x the block's largest magnitude in the last attention block before the boundary, every
               attention layer, keys and values (connector/vllm_kv_caches.py scramble_block); with
               --scramble-scale S also "scramble-xS", the noise S times that magnitude
    zero       every recurrent state (conv and SSM) zeroed at the boundary
    wrong      the last attention block before the boundary, every attention layer, from another prompt of the
               same length with another key (the "attention wrong" control): state right, plausible keys wrong

    python3 -m benchmarks.tiny_attention_probe --family jamba --block 48 --variant base --variant mamba_d_conv=2
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

# a variant's training knobs (tiny_training.train), not config fields
TRAINING = ("drop", "dropall", "recall", "blind", "blind_from", "blind_until", "blind_every", "seed")


def configure(cfg, variant: str):
    """`cfg` with the variant's overrides (`name=value,...`; `base`: none; `drop=`: the training's, below), values
    cast to the field's type."""
    for item in filter(None, variant.split(",")):
        if item == "base" or item.partition("=")[0] in TRAINING:
            continue
        name, value = item.split("=", 1)
        old = getattr(cfg, name)
        setattr(cfg, name, type(old)(value) if old is not None else int(value))
    return cfg


def build(family: str, variant: str, steps: int, folder: Path, device: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hybrid_pd.prefill.dev import tiny_model as tm
    from hybrid_pd.prefill.dev.tiny_families import FAMILIES
    from hybrid_pd.prefill.dev.tiny_training import train

    training = {k: float(v) for k, _, v in (i.partition("=") for i in variant.split(",")) if k in TRAINING}
    spec = tm.TinyModelSpec(family=family, seed=int(training.get("seed", 0)))  # seed: the builds' 0 unless given
    folder.mkdir(parents=True, exist_ok=True)
    vocab = tm._build_tokenizer(spec, folder)
    cfg = configure(FAMILIES[family](spec, vocab), variant)
    torch.manual_seed(spec.seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).to(device)
    tok = AutoTokenizer.from_pretrained(folder)
    started = time.monotonic()
    drop = training.get("dropall", training.get("drop", 0.0))  # dropall: every mixer at once; drop: each alone
    window = (int(training.get("blind_from", 0)), int(training.get("blind_until", steps)))  # blind in these steps
    train(model, tok, spec.seed, steps, drop, "dropall" in training, training.get("recall", 0.0),
          training.get("blind", 0.0), window, int(training.get("blind_every", 1)))
    trained_s = time.monotonic() - started
    model = model.to(torch.bfloat16).to(torch.float32).eval()  # the served weights' rounding, computed in fp32
    return model, tok, trained_s


def cache_tensors(cache):
    """(attention [(keys, values)], recurrent [tensors]) of a transformers cache, whatever its class."""
    import torch

    attention, recurrent = [], []
    for layer in getattr(cache, "layers", ()):
        keys = getattr(layer, "keys", None)
        if isinstance(keys, torch.Tensor) and keys.numel():
            attention.append((keys, layer.values))
        for name in ("conv_states", "recurrent_states", "ssm_states"):
            x = getattr(layer, name, None)  # a tensor, or a dict of them (transformers 5: one per state)
            recurrent += [t for t in (x.values() if isinstance(x, dict) else [x]) if isinstance(t, torch.Tensor)]
    for k, v in zip(getattr(cache, "key_cache", ()), getattr(cache, "value_cache", ())):
        if isinstance(k, torch.Tensor) and k.dim() == 4 and k.shape[2] > 0:
            attention.append((k, v))
    for name in ("conv_states", "ssm_states"):
        for x in getattr(cache, name, ()) or ():
            if isinstance(x, torch.Tensor):
                recurrent.append(x)
    return attention, recurrent


def scramble(lo: int, hi: int, factor: float = 4.0):
    import torch

    def spoil(cache) -> None:
        attention, _ = cache_tensors(cache)
        assert attention, "no attention KV in the cache"
        for i, (k, v) in enumerate(attention):
            scale = factor * max(float(k[:, :, lo:hi].abs().max()), float(v[:, :, lo:hi].abs().max()), 1.0)
            gen = torch.Generator(device="cpu").manual_seed(i)
            for t in (k, v):
                t[:, :, lo:hi] = (torch.randn(t[:, :, lo:hi].shape, generator=gen) * scale).to(t.device, t.dtype)

    return spoil


def wrong_block(other, lo: int, hi: int):
    """The spoil that copies `other`'s (another prompt's cache to the same boundary) attention keys and values of
    positions [lo, hi) into the cache, every attention layer."""

    def spoil(cache) -> None:
        attention, theirs = cache_tensors(cache)[0], cache_tensors(other)[0]
        assert attention and len(attention) == len(theirs), "no attention KV, or not the other prompt's layout"
        for (k, v), (ok, ov) in zip(attention, theirs):
            k[:, :, lo:hi] = ok[:, :, lo:hi]
            v[:, :, lo:hi] = ov[:, :, lo:hi]

    return spoil


def prefix_cache(model, ids: list[int]):
    import torch

    with torch.no_grad():
        device = next(model.parameters()).device
        return model(input_ids=torch.tensor([ids], device=device), use_cache=True).past_key_values


def zero_state(cache) -> None:
    _, recurrent = cache_tensors(cache)
    assert recurrent, "no recurrent state in the cache"
    for x in recurrent:
        x.zero_()


def answer(model, ids: list[int], boundary: int, spoil=None, reference: list[int] | None = None, n: int = 8):
    """Greedy tokens after `ids` (prefix to `boundary` cached, then spoiled; the tail after it one token at a time)
    and the log-probability of the reference's token (or its own) at each position.

    One token at a time: transformers' Jamba (5.17) scans a chunk of several tokens after a cached prefix from a zero
    recurrent state (its Mamba mixer passes the cached state only to the one-token update), so a chunked tail there
    forgets the prefix: 0.64 nats off a full forward's last log-probability where one token at a time is 1e-5 off
    (random weights, std 0.2; 0.005 against 5e-7 at std 0.02)."""
    import torch

    device = next(model.parameters()).device
    with torch.no_grad():
        cache = model(input_ids=torch.tensor([ids[:boundary]], device=device), use_cache=True).past_key_values
        if spoil:
            spoil(cache)
        pos, tokens, logprobs = boundary, [], []

        def step(token: int):
            nonlocal cache, pos
            out = model(
                input_ids=torch.tensor([[token]], device=device),
                past_key_values=cache,
                use_cache=True,
                cache_position=torch.arange(pos, pos + 1, device=device),
            )
            cache, pos = out.past_key_values, pos + 1
            return torch.log_softmax(out.logits[0, -1].float(), -1)

        for token in ids[boundary:]:
            lp = step(token)
        for i in range(n):
            token = int(lp.argmax()) if reference is None else reference[i]
            tokens.append(int(lp.argmax()))
            logprobs.append(float(lp[token]))
            if i + 1 < n:
                lp = step(token)
    return tokens, logprobs


def prompt_ids(tok, salt: int, n: int) -> list[int]:
    """The first `n` ids of the controls' prompt for `salt`: random words, key word salt % 3 + 1 among the first 100
    (the "wrong" control's other prompt is salt + 1000's: another key)."""
    from hybrid_pd.prefill.dev.tiny_training import WORDS, keyed

    rng = random.Random(salt)
    text = " ".join(keyed([rng.choice(WORDS) for _ in range(900)], salt % 3 + 1))
    return tok(text, add_special_tokens=False)["input_ids"][:n]


def probe(model, tok, block: int, prompts: int = 4, scales: tuple[float, ...] = ()) -> dict:
    out = {}
    for tail_name, boundary, tail in (("short", -(-299 // block) * block, 2), ("long", -(-256 // block) * block, 150)):
        spoils = {"scramble": scramble(boundary - block, boundary), "zero": zero_state}
        spoils |= {f"scramble-x{s:g}": scramble(boundary - block, boundary, s) for s in scales}
        moves: dict[str, list[float]] = {name: [] for name in [*spoils, "wrong"]}
        for salt in range(11, 11 + prompts):
            ids, other = (prompt_ids(tok, s, boundary + tail) for s in (salt, salt + 1000))
            ref_tokens, ref_lp = answer(model, ids, boundary)
            spoils["wrong"] = wrong_block(prefix_cache(model, other[:boundary]), boundary - block, boundary)
            for name, spoil in spoils.items():
                _, lp = answer(model, ids, boundary, spoil, ref_tokens)
                moves[name].append(round(max(abs(a - b) for a, b in zip(ref_lp, lp)), 3))
        out[tail_name] = moves
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", action="append", required=True)
    ap.add_argument("--block", type=int, action="append", required=True, help="aligned block per family (tokens)")
    ap.add_argument("--variant", action="append", default=None, help="config overrides name=value,... or base")
    ap.add_argument("--steps", type=int, default=350)
    ap.add_argument("--scramble-scale", type=float, action="append", default=[], help="another scramble's noise scale")
    ap.add_argument("--prompts", type=int, default=4, help="prompts per tail (the controls test one each)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/tiny-attention-probe"))
    args = ap.parse_args(argv)
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        torch.set_num_threads(2)
    for family, block in zip(args.family, args.block):
        for variant in args.variant or ["base"]:
            model, tok, trained_s = build(family, variant, args.steps, args.out / f"{family}-{variant}", device)
            row = {
                "family": family,
                "variant": variant,
                "steps": args.steps,
                "device": device,
                "trained_s": round(trained_s),
                **probe(model, tok, block, args.prompts, scales=tuple(args.scramble_scale)),
            }
            print(json.dumps(row), flush=True)
            with open(args.out / "results.jsonl", "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    sys.exit(main())
