"""The proxy's block hashes equal vLLM's own (vllm imported here only, in the test)."""

from __future__ import annotations

import cbor2
import pytest
import vllm.utils.hashing as hashing  # a moved module fails loudly, never skips
import vllm.v1.core.kv_cache_utils as kv_cache_utils
from hypothesis import given, settings
from hypothesis import strategies as st

from hybrid_pd.proxy.kv.block_hash import as_int_hash, block_key, cbor_canonical, chained_block_hashes
from hybrid_pd.proxy.kv.prompt_keys import ChainCache, PromptKeys

ALGOS = {"sha256": hashing.sha256, "sha256_cbor": hashing.sha256_cbor}


def vllm_hashes(tokens, block_size, fn, extra_first=None):
    out, parent = [], None
    for i, start in enumerate(range(0, len(tokens) - block_size + 1, block_size)):
        extra = extra_first if i == 0 else None
        parent = kv_cache_utils.hash_block_tokens(fn, parent, tokens[start:start + block_size], extra)
        out.append(parent)
    return out


@pytest.mark.parametrize("algo", sorted(ALGOS))
def test_equal_to_vllm_default_seed(algo, monkeypatch):
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    kv_cache_utils.init_none_hash(ALGOS[algo])
    tokens = [0, 1, 255, 256, 65535, 65536, 2**31 - 1, 151643] * 40 + [7, 7, 7]  # partial tail is not hashed
    ours = chained_block_hashes(tokens, 16, algo)
    assert len(ours) == len(tokens) // 16
    assert ours == vllm_hashes(tokens, 16, ALGOS[algo])


@pytest.mark.parametrize("algo", sorted(ALGOS))
def test_routing_keys_are_those_of_vllm_hashes(algo, monkeypatch):
    """What routing looks up (lazily, through the cross-request cache) is vLLM's hash, cut to the index key."""
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    kv_cache_utils.init_none_hash(ALGOS[algo])
    tokens = [0, 1, 255, 256, 65535, 65536, 2**31 - 1, 151643] * 40
    want = [block_key(h) for h in vllm_hashes(tokens, 16, ALGOS[algo])]
    cache = ChainCache()
    assert PromptKeys(tokens[:160], 16, algo, cache=cache).upto(3)[:3] == want[:3]
    assert PromptKeys(tokens, 16, algo, cache=cache).upto(len(tokens)) == want
    assert PromptKeys(tokens, 16, algo).upto(len(tokens)) == want


def test_equal_to_vllm_with_pythonhashseed_and_cache_salt(monkeypatch):
    monkeypatch.setenv("PYTHONHASHSEED", "1234")
    kv_cache_utils.init_none_hash(hashing.sha256)
    tokens = list(range(1000, 1064))
    expected = vllm_hashes(tokens, 16, hashing.sha256, extra_first=(("cache_salt", "tenant-a"),))
    assert chained_block_hashes(tokens, 16, "sha256", seed="1234", cache_salt="tenant-a") == expected
    assert chained_block_hashes(tokens, 16, "sha256", seed="1234") != expected  # the salt matters
    monkeypatch.delenv("PYTHONHASHSEED")
    kv_cache_utils.init_none_hash(hashing.sha256)


def test_coarser_group_hashes_are_every_kth_fine_hash():
    tokens = list(range(64))
    fine, coarse = chained_block_hashes(tokens, 16), chained_block_hashes(tokens, 32)
    view = kv_cache_utils.BlockHashListWithBlockSize(fine, 16, 32)
    assert [view[i] for i in range(len(view))] == [fine[1], fine[3]]
    assert coarse != [fine[1], fine[3]]  # a 32-token hash is NOT what a 32-size group publishes


def test_int_form_is_vllm_int_event_hash(monkeypatch):
    monkeypatch.setattr(kv_cache_utils.envs, "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", True, raising=False)
    h = chained_block_hashes(list(range(16)), 16)[0]
    assert as_int_hash(h) == kv_cache_utils.maybe_convert_block_hash(h)


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers(-(2**64) + 1, 2**64 - 1) | st.binary(max_size=40)
                    | st.text(max_size=20), lambda inner: st.lists(inner, max_size=5).map(tuple), max_leaves=20))
def test_canonical_cbor_equals_cbor2(obj):
    assert cbor_canonical(obj) == cbor2.dumps(obj, canonical=True)
