"""The usable hybrid hit, with exact expected token counts."""

from __future__ import annotations

from hybrid_pd.proxy.kv.block_hash import as_int_hash, chained_block_hashes
from hybrid_pd.proxy.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from hybrid_pd.proxy.kv.index import KVIndex

TOKENS = list(range(500, 532))  # 32 tokens
H4 = chained_block_hashes(TOKENS, 4)  # 8 hashes at granularity 4
URL = "http://w:1"


def stored(hashes, group, kind, block_size=4, medium="GPU"):
    return BlockStored(list(hashes), None, [], block_size, medium=medium, group_idx=group, kv_cache_spec_kind=kind)


def hit(idx: KVIndex, n: int = 32, configured: int = 0) -> int:
    return idx.hit_tokens(URL, n, lambda h: chained_block_hashes(TOKENS[:n], h), configured)


def index(*events) -> KVIndex:
    idx = KVIndex()
    idx.apply(URL, KVEventBatch(0, list(events)))
    return idx


def test_hit_needs_attention_prefix_and_mamba_checkpoint():
    # attention blocks 1..5 stored, Mamba checkpoints after blocks 2 and 6: usable = 2 blocks (6 > 5)
    idx = index(stored(H4[:5], 0, "full_attention"), stored([H4[1], H4[5]], 1, "mamba"))
    assert hit(idx) == 8


def test_attention_prefix_stops_at_the_first_missing_block():
    idx = index(stored([H4[0], H4[1], H4[3], H4[4]], 0, "full_attention"), stored([H4[3]], 1, "mamba"))
    assert hit(idx) == 0  # the checkpoint at 4 blocks is past the attention gap at block 3


def test_every_mamba_group_needs_the_checkpoint():
    idx = index(stored(H4, 0, "full_attention"), stored([H4[3], H4[5]], 1, "mamba"), stored([H4[3]], 2, "mamba"))
    assert hit(idx) == 16


def test_last_token_is_never_a_hit():
    idx = index(stored(H4, 0, "full_attention"), stored(H4, 1, "mamba"))
    assert hit(idx) == 28  # 32 tokens: the 8th block would cover the last token, vLLM recomputes it
    assert hit(idx, n=30) == 28


def test_pure_attention_model_uses_the_attention_prefix():
    idx = index(stored(H4[:3], 0, "full_attention"))
    assert hit(idx) == 12


def test_mamba_group_learned_from_another_worker_blocks_hits_here():
    idx = index(stored(H4[:3], 0, "full_attention"))
    idx.apply("http://other:1", KVEventBatch(0, [stored([H4[0]], 1, "mamba")]))
    assert hit(idx) == 0


def test_coarse_groups_with_learned_hash_block_size():
    # attention blocks of 8 tokens, Mamba of 8, a sliding-window group of 4 -> hash granularity gcd = 4;
    # an 8-token group publishes every second 4-token hash
    idx = index(stored([H4[1], H4[3], H4[5]], 0, "full_attention", 8), stored([H4[3]], 1, "mamba", 8),
                stored([H4[0]], 2, "sliding_window", 4))
    assert hit(idx) == 16
    assert hit(idx, configured=8) == 0  # the wrong granularity matches nothing


def test_removed_cleared_and_other_media():
    idx = index(stored(H4[:4], 0, "full_attention"), stored([H4[1], H4[3]], 1, "mamba"),
                stored([H4[5]], 1, "mamba", medium="CPU"))
    assert hit(idx) == 16
    idx.apply(URL, KVEventBatch(0, [BlockRemoved([H4[3]], "GPU", group_idx=1)]))
    assert hit(idx) == 8
    idx.apply(URL, KVEventBatch(0, [BlockRemoved([H4[1]], "CPU", group_idx=1)]))  # another tier: ignored
    assert hit(idx) == 8
    idx.apply(URL, KVEventBatch(0, [AllBlocksCleared()]))
    assert hit(idx) == 0


def test_int_block_hashes():
    idx = index(stored([as_int_hash(h) for h in H4[:2]], 0, "full_attention"),
                stored([as_int_hash(H4[1])], 1, "mamba"))
    assert hit(idx) == 8


def test_sequence_gaps():
    idx = KVIndex().of(URL)
    for seq in (0, 1, 4, 5, 9):
        idx.note_seq(seq)
    assert idx.gaps == 5 and idx.last_seq == 9


def test_an_empty_mamba_store_still_declares_the_group():
    # what a real engine in align mode sends on a prompt's first pass: attention blocks, no Mamba checkpoint
    idx = index(stored([], 0, "mamba"), stored(H4[:2], 1, "full_attention"))
    assert idx.specs[0].kind == "mamba"
    assert hit(idx) == 0
