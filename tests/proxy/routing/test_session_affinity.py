from hybrid_pd.proxy.routing import RequestContext
from hybrid_pd.proxy.routing.session_affinity import SessionAffinityScorer, rendezvous_weight
from tests.proxy.routing.helpers import workers


def test_a_session_sticks_to_its_heaviest_worker():
    ws = workers("a", "b", "c")
    ctx = RequestContext(session="alice")
    weights = [rendezvous_weight("alice", w.url) for w in ws]
    expected = [1.0 if x == max(weights) else 0.0 for x in weights]
    s = SessionAffinityScorer()
    assert s.score(ctx, ws) == expected == s.score(ctx, list(ws))
    assert sum(expected) == 1.0


def test_exact_pick_and_failover_moves_only_that_worker_sessions():
    ws = workers("a", "b", "c")
    s = SessionAffinityScorer()
    home = {sid: ws[s.score(RequestContext(session=sid), ws).index(1.0)] for sid in map(str, range(40))}
    assert len({w.url for w in home.values()}) == 3  # sessions spread over all workers
    gone = ws[0]
    rest = ws[1:]
    for sid, w in home.items():
        new = rest[s.score(RequestContext(session=sid), rest).index(1.0)]
        if w is not gone:
            assert new is w  # rendezvous hashing: only the lost worker's sessions move


def test_no_session_scores_zero():
    assert SessionAffinityScorer().score(RequestContext(), workers("a", "b")) == [0.0, 0.0]
