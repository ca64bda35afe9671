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
