from hybrid_pd.proxy.kv.block_hash import chained_block_hashes
from hybrid_pd.proxy.kv.events import BlockStored, KVEventBatch
from hybrid_pd.proxy.kv.index import KVIndex
from hybrid_pd.proxy.routing import RequestContext
from hybrid_pd.proxy.routing.kv_hit import KVHitScorer
from tests.proxy.routing.helpers import deps, workers

TOKENS = list(range(100, 120))  # 20 tokens = 5 blocks of 4
H = chained_block_hashes(TOKENS, 4)


def stored(hashes, group, kind):
    return BlockStored(list(hashes), None, [], 4, medium="GPU", group_idx=group, kv_cache_spec_kind=kind)


def test_scores_usable_hybrid_hit_over_prompt_length():
    ws = workers("a", "b", "c")
    idx = KVIndex()
    idx.apply(ws[0].url, KVEventBatch(0, [stored(H[:4], 0, "full_attention"), stored([H[1], H[3]], 1, "mamba")]))
    idx.apply(ws[1].url, KVEventBatch(0, [stored(H[:4], 0, "full_attention"), stored([H[0]], 1, "mamba")]))
    ctx = RequestContext(token_ids=TOKENS)
    assert KVHitScorer(deps(idx)).score(ctx, ws) == [16 / 20, 4 / 20, 0.0]
    assert ctx.hits == {ws[0].url: 16, ws[1].url: 4, ws[2].url: 0}


def test_without_token_ids_everyone_scores_zero():
    ws = workers("a")
    idx = KVIndex()
    idx.apply(ws[0].url, KVEventBatch(0, [stored(H, 0, "full_attention")]))
    assert KVHitScorer(deps(idx)).score(RequestContext(), ws) == [0.0]
