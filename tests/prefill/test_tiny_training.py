"""The tiny models' corpus and training aids: the rule, the key words' place, the attention mask, the slow heads."""

import math
import random

import pytest
import torch

from hybrid_pd.prefill.dev.tiny_training import (
    DENSITY,
    KEYS,
    RECALL_START,
    WORDS,
    Corpus,
    blind_mixers,
    drop_mixers,
    hide_keys,
    keyed,
    long_memory,
)


def test_the_corpus_follows_its_rule_with_the_key_of_its_first_words():
    corpus = Corpus(seed=0)
    index = {w: i for i, w in enumerate(corpus.words)}
    keys_seen, followed, total = set(), 0, 0
    for _ in range(40):
        text = corpus.document(400).split()
        keys = [i for i, w in enumerate(text) if w in KEYS]
        assert not keys or (len({text[i] for i in keys}) == 1 and keys[-1] < 200)  # one key, among the first words
        key = KEYS.index(text[keys[0]]) + 1 if keys else 0
        keys_seen.add(key)
        words = [index[w] for w in text if w not in KEYS]
        for i in range(3, len(words)):
            total += 1
            followed += words[i] == corpus.perms[key][corpus.table[words[i - 3]][words[i - 1]]]
    assert keys_seen == {0, 1, 2, 3}
    assert 0.82 < followed / total < 0.9  # 85% by the rule, 15% noise (which hits the rule's word now and then)
    assert all(sorted(p) == list(range(len(corpus.words))) for p in corpus.perms) and set(KEYS).isdisjoint(WORDS)
    unkeyed = Corpus(seed=0, keyed=False)  # a model without a long state (LFM2) trains on these
    assert not any(w in KEYS for _ in range(20) for w in unkeyed.document(300).split())


def test_keyed_puts_the_key_among_the_first_hundred_words_only():
    words = [f"w{i}" for i in range(300)]
    out = keyed(words, 2)
    assert [w for w in out if w not in KEYS] == words
    positions = [i for i, w in enumerate(out) if w == KEYS[1]]
    assert len(positions) == 100 * DENSITY and positions[-1] < 125
    assert keyed(words, 0) == words


def test_hide_keys_hides_each_key_token_and_the_three_after_it_from_later_queries():
    ids = torch.tensor([[5, 9, 5, 5, 5, 5, 5, 9]])  # 9 is a key token
    mask = hide_keys(ids, torch.tensor([9]))[0, 0]
    assert mask.shape == (8, 8) and not mask.triu(1).any()  # causal
    assert mask.diagonal().all()  # every query attends to itself
    assert mask[6].tolist() == [True, False, False, False, False, True, True, False]  # 1-4 hidden, 0 and 5 read
    assert mask[7, :7].tolist() == mask[6, :7].tolist() and mask[7, 7]


def test_long_memory_slows_half_the_heads_of_each_recurrent_layer():
    model = torch.nn.Module()
    model.mixer = torch.nn.Module()
    model.mixer.A_log = torch.nn.Parameter(torch.zeros(4))
    model.mixer.proj = torch.nn.Linear(2, 2)
    assert long_memory(model)
    assert torch.allclose(model.mixer.A_log, torch.tensor([math.log(1e-3)] * 2 + [0.0, 0.0]))
    assert not long_memory(torch.nn.Linear(2, 2))


def test_drop_mixers_drops_the_mamba_mixers_in_training_only_and_comes_off():
    """Jamba's tiny model: both Mamba mixers hooked; dropped (p = 1) they change the training forward and leave the
    eval forward alone; p = 0 changes nothing; the handles take the hooks off."""
    from transformers import AutoModelForCausalLM

    from hybrid_pd.prefill.dev.tiny_families import FAMILIES
    from hybrid_pd.prefill.dev.tiny_model import TinyModelSpec

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(FAMILIES["jamba"](TinyModelSpec(family="jamba"), 512))
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])

    def logits(training: bool) -> torch.Tensor:
        model.train(training)
        with torch.no_grad():
            return model(input_ids=ids).logits

    plain = logits(True)
    hooks = drop_mixers(model, 1.0, random.Random(0))
    assert len(hooks) == 2
    assert not torch.allclose(logits(True), plain) and torch.equal(logits(False), plain)
    for handle in hooks:
        handle.remove()
    assert torch.equal(logits(True), plain)
    kept = drop_mixers(model, 0.0, random.Random(0))
    assert torch.equal(logits(True), plain)
    for handle in kept:
        handle.remove()
    together = drop_mixers(model, 1.0, random.Random(0), together=True)  # one draw a step for both, and its hook
    assert len(together) == 3 and torch.equal(logits(False), plain)
    dropped = logits(True)
    for handle in together[:1]:  # the first mixer's hook off: the second alone still drops
        handle.remove()
    assert not torch.allclose(dropped, plain) and not torch.allclose(logits(True), dropped)
    for handle in together[1:]:
        handle.remove()
    assert torch.equal(logits(True), plain)


MIXER_KINDS = [("jamba", "MambaMixer"), ("qwen3_5", "GatedDeltaNet"), ("lfm2", "ShortConv")]


@pytest.mark.parametrize("family, mixer", MIXER_KINDS)
def test_blind_mixers_hides_the_masked_positions_from_every_recurrent_mixer_in_training_only(family, mixer):
    """A tiny model of each kind of recurrent mixer (RECURRENT_MIXERS: Mamba, gated DeltaNet, short convolution),
    position 2 hidden: each mixer's input there is zero in training (its neighbours as they were, for the first
    mixer, before anything hidden could reach them), the logits before it unchanged and after it moved (the mixers
    never saw that token); the eval forward and a run without a mask unchanged."""
    from transformers import AutoModelForCausalLM

    from hybrid_pd.prefill.dev.tiny_families import FAMILIES
    from hybrid_pd.prefill.dev.tiny_model import TinyModelSpec

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(FAMILIES[family](TinyModelSpec(family=family), 512))
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    seen: list[torch.Tensor] = []

    def logits(training: bool) -> torch.Tensor:
        seen.clear()
        model.train(training)
        with torch.no_grad():
            return model(input_ids=ids).logits

    plain = logits(True)
    keep: dict = {}
    hooks = blind_mixers(model, keep)
    mixers = [m for m in model.modules() if type(m).__name__.endswith(mixer)]
    capture = [m.register_forward_pre_hook(lambda m, a, k: seen.append(k.get("hidden_states", a[0] if a else None)),
                                           with_kwargs=True) for m in mixers]
    assert len(hooks) == len(mixers) > 0
    assert torch.equal(logits(True), plain)  # no mask yet
    keep["mask"] = torch.tensor([[1.0, 1, 0, 1, 1, 1]])[..., None]
    hidden = logits(True)
    assert len(seen) == len(mixers) and all(float(x[0, 2].abs().max()) == 0 for x in seen)
    assert float(seen[0][0, [0, 1, 3, 4, 5]].abs().amax(-1).min()) > 0
    assert torch.allclose(hidden[0, :2], plain[0, :2]) and not torch.allclose(hidden[0, 2:], plain[0, 2:])
    assert torch.equal(logits(False), plain)
    for handle in hooks + capture:
        handle.remove()
    assert torch.equal(logits(True), plain)


def test_a_recall_document_copies_what_followed_an_earlier_occurrence():
    def copies(corpus: Corpus) -> float:
        """How often the next word is the one that followed the current word's last earlier occurrence."""
        copied = total = 0
        for _ in range(20):
            text = [w for w in corpus.document(400).split() if w not in KEYS]
            for t in range(RECALL_START[1], len(text) - 1):
                last = max((i for i in range(t) if text[i] == text[t]), default=None)
                if last is not None and last + 1 < t:
                    total += 1
                    copied += text[t + 1] == text[last + 1]
        return copied / total

    # a span's first word is random; its second copies what followed that word's last occurrence, and the rest go
    # on from there (where the span passes a repeat of a word, its last occurrence is another: 62% on this seed)
    assert copies(Corpus(seed=0, recall=1.0)) > 0.55
    assert len(Corpus(seed=0, recall=1.0).document(400).split()) == 400
    assert copies(Corpus(seed=0)) < 0.15  # the rule's documents: a copy only by chance


def test_blind_steps_hide_positions_in_their_window_only(tiny_model):
    """train(blind=, blind_steps=, blind_every=): outside the window the mixers see every position (an empty window
    trains the weights blind=0 trains), inside it they do not (a window over every step trains what no window does,
    and other weights than an empty one), and with blind_every=2 on its first step only. The tiny Zamba2, two
    steps."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hybrid_pd.prefill.dev.tiny_families import FAMILIES
    from hybrid_pd.prefill.dev.tiny_model import TinyModelSpec
    from hybrid_pd.prefill.dev.tiny_training import train

    tok = AutoTokenizer.from_pretrained(tiny_model)

    def trained(blind: float, window: tuple[int, int] | None, every: int = 1) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(FAMILIES["zamba2"](TinyModelSpec(family="zamba2"), len(tok)))
        train(model, tok, 0, 2, blind=blind, blind_steps=window, blind_every=every)
        return [p.detach().clone() for p in model.parameters()]

    def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
        return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))

    plain, empty = trained(0.0, None), trained(0.5, (0, 0))
    everywhere, whole = trained(0.5, None), trained(0.5, (0, 2))
    assert same(plain, empty)
    assert same(everywhere, whole)
    assert not same(empty, whole)
    # every other step of the window: blind at step 0 only, as a window of the first step alone
    assert same(trained(0.5, (0, 2), every=2), trained(0.5, (0, 1)))
    assert not same(trained(0.5, None, every=2), whole)
