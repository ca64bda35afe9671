"""The tiny model builder: deterministic by seed, cached, a real hybrid model with a chat template."""

import dataclasses
import hashlib
import json
from pathlib import Path

from hybrid_pd.prefill.dev.tiny_model import TinyModelSpec, build_tiny_model
from hybrid_pd.prefill.launch.probes import model_kind


def digest(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.iterdir()) if p.name in ("model.safetensors", "tokenizer.json")}


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path, tiny_model):
    """The whole build (tokenizer, initial weights, training, saving) twice from one seed gives the same bytes, and
    from another seed other weights with the same tokenizer. A few training steps (short and long documents) tell as
    well as the 350 the engines' models take (minutes each, paid once per machine: the cache), and the tokenizer is
    the cached one's."""
    spec = TinyModelSpec(seed=0, train_steps=5)
    first, again = (digest(build_tiny_model(spec, out=tmp_path / name)) for name in ("first", "again"))
    assert first == again
    other = digest(build_tiny_model(dataclasses.replace(spec, seed=1), out=tmp_path / "other"))
    assert other["tokenizer.json"] == first["tokenizer.json"] == digest(Path(tiny_model))["tokenizer.json"]
    assert other["model.safetensors"] != first["model.safetensors"]


def test_cached_build_is_found_not_rebuilt(tiny_model):
    from pathlib import Path

    assert build_tiny_model(TinyModelSpec(seed=0)) == Path(tiny_model)


def test_it_is_a_hybrid_model_with_a_chat_template(tiny_model):
    from transformers import AutoTokenizer

    cfg = json.loads(Path(f"{tiny_model}/config.json").read_text())
    assert set(cfg["layer_types"]) == {"linear_attention", "full_attention"}
    assert model_kind(tiny_model) == "hybrid"
    tok = AutoTokenizer.from_pretrained(tiny_model)
    text = tok.apply_chat_template([{"role": "user", "content": "hello world"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text == "<|im_start|>user\nhello world<|im_end|>\n<|im_start|>assistant\n"
    ids = tok(text)["input_ids"]
    assert tok.convert_tokens_to_ids("<|im_start|>") in ids and tok.decode(ids) == text


def test_a_family_revision_renames_that_family_only(monkeypatch):
    """A builder change to one family (zamba2's tied embeddings) must not reuse its old cached folder, nor
    rebuild the other families."""
    from hybrid_pd.prefill.dev import tiny_families

    names = {f: TinyModelSpec(family=f).folder_name() for f in ("qwen3_next", "zamba2")}
    monkeypatch.setitem(tiny_families.FAMILY_REVISION, "zamba2", tiny_families.FAMILY_REVISION["zamba2"] + 1)
    assert TinyModelSpec(family="zamba2").folder_name() != names["zamba2"]
    assert TinyModelSpec(family="qwen3_next").folder_name() == names["qwen3_next"]


def test_zamba2_is_built_with_its_training_recipe(tmp_path):
    """The tiny Zamba2's build trains tiny_families.FAMILY_TRAINING's recipe (8 steps per build step, the second half
    with 30% of the positions hidden from its Mamba mixers): its saved weights are those of train() called so, and not
    those of as many plain steps. One build step: 8 training steps."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hybrid_pd.prefill.dev.tiny_families import FAMILIES, FAMILY_TRAINING
    from hybrid_pd.prefill.dev.tiny_training import train

    spec = TinyModelSpec(family="zamba2", train_steps=1)
    recipe = FAMILY_TRAINING["zamba2"]
    assert (recipe.steps(1), recipe.blind_steps(1), recipe.blind) == (8, (4, 8), 0.3)
    built = load_file(build_tiny_model(spec, out=tmp_path / "built") / "model.safetensors")
    tok = AutoTokenizer.from_pretrained(tmp_path / "built")

    def trained(**blind) -> dict:
        threads = torch.get_num_threads()
        torch.manual_seed(spec.seed)
        torch.set_num_threads(1)  # as the build
        try:
            model = AutoModelForCausalLM.from_config(FAMILIES["zamba2"](spec, len(tok)), dtype=torch.float32)
            train(model, tok, spec.seed, 8, **blind)
        finally:
            torch.set_num_threads(threads)
        return {k: v.to(torch.bfloat16) for k, v in model.state_dict().items() if k in built}

    def same(weights: dict) -> bool:
        assert weights.keys() == built.keys()
        return all(torch.equal(built[k], v) for k, v in weights.items())

    assert same(trained(blind=0.3, blind_steps=(4, 8)))
    assert not same(trained())
