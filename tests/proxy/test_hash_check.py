"""Learning the hash granularity from a worker's own events, and refusing hashes the proxy cannot reproduce."""

from __future__ import annotations

from hybrid_pd.proxy.kv.block_hash import as_int_hash, chained_block_hashes
from hybrid_pd.proxy.kv.events import BlockStored, KVEventBatch
from hybrid_pd.proxy.kv.hash_check import CANNOT_TELL, hash_granularity
from hybrid_pd.proxy.kv.index import KVIndex

TOKENS = list(range(300, 332))


def event(hashes, tokens, parent=None, block_size=8, extra_keys=None):
    return BlockStored(list(hashes), parent, list(tokens), block_size, medium="GPU", group_idx=0,
                       kv_cache_spec_kind="full_attention", extra_keys=extra_keys)


def test_learns_the_granularity_vllm_hashed_with():
    h2 = chained_block_hashes(TOKENS, 2)
    h8 = chained_block_hashes(TOKENS, 8)
    # an 8-token group publishes, for its j-th block, the chained hash at the last g-boundary
    assert hash_granularity(event([h2[3], h2[7]], TOKENS[:16]), "sha256", "vllm-none-hash") == 2
    assert hash_granularity(event([h8[0]], TOKENS[:8]), "sha256", "vllm-none-hash") == 8
    assert hash_granularity(event([h8[2]], TOKENS[16:24], parent=h8[1]), "sha256", "vllm-none-hash") == 8
    assert hash_granularity(event([as_int_hash(h8[0])], TOKENS[:8]), "sha256", "vllm-none-hash") == 8


def test_wrong_algorithm_or_seed_is_reported():
    h8 = chained_block_hashes(TOKENS, 8)
    assert hash_granularity(event([h8[0]], TOKENS[:8]), "sha256", "42") is None
    assert hash_granularity(event([h8[0]], TOKENS[:8]), "sha256_cbor", "vllm-none-hash") is None


def test_events_that_cannot_tell():
    h8 = chained_block_hashes(TOKENS, 8)
    assert hash_granularity(event([h8[0]], TOKENS[:4]), "sha256", "x") == CANNOT_TELL
    assert hash_granularity(event([h8[0]], TOKENS[:8], extra_keys=[("salt",)]), "sha256", "x") == CANNOT_TELL
    assert hash_granularity(event([h8[1]], TOKENS[8:16], parent=7), "sha256", "x") == CANNOT_TELL
    # vLLM 0.26's Mamba store over 3 blocks of which only the last is kept: one hash for 24 tokens
    assert hash_granularity(event([h8[2]], TOKENS[:24]), "sha256", "vllm-none-hash") == CANNOT_TELL


def test_index_uses_the_learned_granularity():
    h4 = chained_block_hashes(TOKENS, 4)  # workers hash at 4 (prefix_match_unit) but every group has blocks of 8
    ev_attn = event([h4[1], h4[3], h4[5]], TOKENS[:24])
    ev_mamba = BlockStored([h4[3]], None, [], 8, medium="GPU", group_idx=1, kv_cache_spec_kind="mamba")
    idx = KVIndex()
    idx.apply("http://w:1", KVEventBatch(0, [ev_attn, ev_mamba]))
    assert idx.hashes_verified is True and idx.detected_hash_block_size == 4
    assert idx.hit_tokens("http://w:1", 32, lambda h: chained_block_hashes(TOKENS, h)) == 16
    bad = KVIndex(seed="other")
    bad.apply("http://w:1", KVEventBatch(0, [ev_attn, ev_mamba]))
    assert bad.hashes_verified is False


def test_index_adopts_the_launchers_seed_of_workers_on_older_vllm():
    """vLLM < 0.27 seeds NONE_HASH randomly unless PYTHONHASHSEED is set; our launchers then set "0". A proxy
    left on the default seed finds that out from the first event and hashes prompts with it."""
    h8 = chained_block_hashes(TOKENS, 8, seed="0")
    idx = KVIndex()
    idx.apply("http://w:1", KVEventBatch(0, [event([h8[0]], TOKENS[:8])]))
    assert idx.hashes_verified is True and idx.seed == "0"
    pinned = KVIndex(seed="7")  # a seed the operator set is never second-guessed
    pinned.apply("http://w:1", KVEventBatch(0, [event([h8[0]], TOKENS[:8])]))
    assert pinned.hashes_verified is False and pinned.seed == "7"
