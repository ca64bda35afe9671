from hybrid_pd.proxy.routing import RequestContext
from hybrid_pd.proxy.routing.least_loaded import LeastLoadedScorer
from tests.proxy.routing.helpers import workers


def test_scores_by_in_flight():
    ws = workers("a", "b", "c")
    for w, n in zip(ws, (3, 0, 1)):
        w.in_flight = n
    assert LeastLoadedScorer().score(RequestContext(), ws) == [0.25, 1.0, 0.75]


def test_idle_workers_all_score_one():
    assert LeastLoadedScorer().score(RequestContext(), workers("a", "b")) == [1.0, 1.0]
