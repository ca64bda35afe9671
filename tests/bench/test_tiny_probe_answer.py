"""answer() of benchmarks/tiny_attention_probe.py, the transformers side of the tiny models' forward checks: a cached
prefix and then the tail must give what one forward over the whole prompt gives, for Jamba too (whose transformers
Mamba mixer continues a chunk of several tokens from a zero state)."""

import random

import pytest
import torch


@pytest.mark.parametrize("family", ["jamba", "zamba2"])
def test_answer_continues_a_cached_prefix_as_one_forward_over_the_prompt(family):
    from transformers import AutoModelForCausalLM

    from benchmarks.tiny_attention_probe import answer
    from hybrid_pd.prefill.dev.tiny_families import FAMILIES
    from hybrid_pd.prefill.dev.tiny_model import TinyModelSpec

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(FAMILIES[family](TinyModelSpec(family=family), 512)).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(std=0.05)  # at 0.1-0.2 transformers' Zamba2 parts from itself one token at a time (1e-3-0.2)
        ids = [random.Random(1).randrange(512) for _ in range(60)]
        whole = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, -1], -1)
    tokens, logprobs = answer(model, ids, 48, n=1)
    assert tokens == [int(whole.argmax())]
    assert abs(logprobs[0] - float(whole.max())) < 1e-3, (logprobs, float(whole.max()))


def test_a_variants_seed_draws_other_weights_and_seed_0_is_the_builds(tmp_path):
    from benchmarks.tiny_attention_probe import build

    def weights(variant):
        model, _, _ = build("zamba2", variant, 0, tmp_path / variant, "cpu")
        return torch.cat([p.detach().flatten() for p in model.parameters()])

    base = weights("base")
    assert torch.equal(weights("seed=0"), base)
    assert not torch.equal(weights("seed=1"), base)


def test_the_wrong_spoil_puts_the_other_prompts_last_block_in_every_attention_layer_and_nothing_else():
    """wrong_block: positions [lo, hi) of every attention layer's keys and values become the other prompt's, the
    positions before stay, and the recurrent state is untouched (the "attention wrong" control: state right)."""
    from transformers import AutoModelForCausalLM

    from benchmarks.tiny_attention_probe import cache_tensors, prefix_cache, wrong_block
    from hybrid_pd.prefill.dev.tiny_families import FAMILIES
    from hybrid_pd.prefill.dev.tiny_model import TinyModelSpec

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(FAMILIES["qwen3_5"](TinyModelSpec(family="qwen3_5"), 512)).eval()
    rng = random.Random(2)
    ids, other = ([rng.randrange(512) for _ in range(48)] for _ in range(2))
    cache, theirs = prefix_cache(model, ids), prefix_cache(model, other)
    (attention, recurrent), (their_attention, _) = cache_tensors(cache), cache_tensors(theirs)
    before = [(k.clone(), v.clone()) for k, v in attention], [x.clone() for x in recurrent]
    wrong_block(theirs, 32, 48)(cache)
    assert attention and recurrent
    for (k, v), (k0, v0), (ok, ov) in zip(attention, before[0], their_attention):
        assert torch.equal(k[:, :, 32:48], ok[:, :, 32:48]) and torch.equal(v[:, :, 32:48], ov[:, :, 32:48])
        assert torch.equal(k[:, :, :32], k0[:, :, :32]) and torch.equal(v[:, :, :32], v0[:, :, :32])
        assert not torch.equal(k, k0)
    assert all(torch.equal(x, x0) for x, x0 in zip(recurrent, before[1]))
