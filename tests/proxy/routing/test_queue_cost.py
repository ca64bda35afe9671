from hybrid_pd.proxy.kv.block_hash import chained_block_hashes
from hybrid_pd.proxy.kv.events import BlockStored, KVEventBatch
from hybrid_pd.proxy.kv.index import KVIndex
from hybrid_pd.proxy.routing import RequestContext
from hybrid_pd.proxy.routing.queue_cost import QueueCostScorer
from hybrid_pd.proxy.workers import WorkerPool
from tests.proxy.routing.helpers import deps, workers

TOKENS = list(range(100, 120))  # 20 tokens = 5 blocks of 4
H = chained_block_hashes(TOKENS, 4)


def holding_16_of_20(ws) -> KVIndex:
    """ws[0] holds a usable hit of 16 tokens (attention for 4 blocks, a checkpoint after block 4), ws[1] none."""
    idx = KVIndex()
    idx.apply(ws[0].url, KVEventBatch(0, [BlockStored(list(H[:4]), None, [], 4, medium="GPU", group_idx=0,
                                                      kv_cache_spec_kind="full_attention"),
                                          BlockStored([H[3]], None, [], 4, medium="GPU", group_idx=1,
                                                      kv_cache_spec_kind="mamba")]))
    return idx


def test_the_holder_wins_until_its_queue_costs_more_than_the_prefix_elsewhere():
    ws = workers("a", "b")
    scorer = QueueCostScorer(deps(holding_16_of_20(ws)))
    ctx = RequestContext(token_ids=TOKENS)
    assert scorer.score(ctx, ws) == [1.0, 5 / 21]  # costs 4 and 20
    ws[0].queued_tokens = 16  # 16 + 4 = 20 = b's 20: a tie
    assert scorer.score(RequestContext(token_ids=TOKENS), ws) == [1.0, 1.0]
    ws[0].queued_tokens = 17  # 21 > 20: the burst spreads to b
    assert scorer.score(RequestContext(token_ids=TOKENS), ws) == [21 / 22, 1.0]


def test_busy_counts_the_uncached_tokens_while_the_request_is_in_flight():
    w = workers("a")[0]
    with WorkerPool.busy(w, 300) as busy:
        assert (w.in_flight, w.queued_tokens) == (1, 300)
        busy.keep()  # a prefill answer left behind still occupies P
    assert (w.in_flight, w.queued_tokens) == (1, 300)
    busy.release()
    assert (w.in_flight, w.queued_tokens) == (0, 0)


def test_without_token_ids_it_is_least_queued():
    ws = workers("a", "b")
    ws[1].queued_tokens = 99
    assert QueueCostScorer(deps(KVIndex())).score(RequestContext(), ws) == [1.0, 1 / 100]
