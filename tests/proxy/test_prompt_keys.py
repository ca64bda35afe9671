"""A prompt's keys, lazily and through the cross-request chain cache, are the keys of vLLM's chained hashes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hybrid_pd.proxy.kv.block_hash import block_key, chained_block_hashes
from hybrid_pd.proxy.kv.prompt_keys import ChainCache, PromptKeys

BASE = list(range(70000, 70064))
TURN = list(range(512))  # 8 blocks of 64 tokens: 2 spans of 4 blocks


def expected(tokens, h, algo="sha256", seed="vllm-none-hash", salt=None):
    return [block_key(x) for x in chained_block_hashes(tokens, h, algo, seed, salt)]


prompt = st.tuples(st.integers(0, 64), st.lists(st.integers(0, 2**31 - 1), max_size=40)).map(
    lambda p: BASE[: p[0]] + p[1])  # prompts sharing prefixes of BASE, as turns and system prompts do


@settings(max_examples=200, deadline=None)
@given(prompts=st.lists(prompt, min_size=1, max_size=6), h=st.sampled_from([1, 3, 4, 16]),
       algo=st.sampled_from(["sha256", "sha256_cbor"]),
       salts=st.lists(st.sampled_from([None, "tenant"]), min_size=6, max_size=6),
       seed=st.sampled_from(["vllm-none-hash", "0"]), reads=st.lists(st.integers(0, 30), max_size=4),
       max_blocks=st.sampled_from([0, 5, 1 << 16]), span=st.sampled_from([1, 8, 12, 256]))
def test_keys_equal_the_chained_hashes_however_read(prompts, h, algo, salts, seed, reads, max_blocks, span):
    cache = ChainCache(max_blocks, span)
    for tokens, salt in zip(prompts, salts):
        for cached in (cache, None):
            keys = PromptKeys(tokens, h, algo, seed, salt, cached)
            for n in reads:  # partial reads extend the same list
                assert keys.upto(n)[:n] == expected(tokens, h, algo, seed, salt)[:n]
            assert keys.upto(len(tokens)) == expected(tokens, h, algo, seed, salt)


def test_a_prefix_seen_before_is_not_hashed_again():
    cache = ChainCache()
    PromptKeys(TURN, 64, cache=cache).upto(8)
    assert cache.blocks == 8
    turn2 = TURN + list(range(5000, 5320))  # one more span of 4 blocks, then 1 block: a partial span
    assert PromptKeys(turn2, 64, cache=cache).upto(100) == expected(turn2, 64)
    assert cache.blocks == 12  # only the new whole span was hashed into the cache
    assert PromptKeys(TURN, 64, cache=cache, cache_salt="t").upto(8) == expected(TURN, 64, salt="t")
    assert cache.blocks == 20  # another salt is another chain


def test_ids_past_32_bits_skip_the_cache_but_hash_right():
    cache = ChainCache()
    tokens = [2**40, -1] + TURN[2:]
    assert PromptKeys(tokens, 64, cache=cache).upto(8) == expected(tokens, 64)
    assert cache.blocks == 0


def test_the_cache_starts_over_past_its_bound():
    cache = ChainCache(max_blocks=3)
    PromptKeys(TURN, 64, cache=cache).upto(8)
    assert cache.blocks == 8
    assert PromptKeys(TURN, 64, cache=cache).upto(8) == expected(TURN, 64)
    assert cache.blocks == 8  # emptied, then filled again by this prompt
