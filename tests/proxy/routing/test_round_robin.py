from hybrid_pd.proxy.routing import RequestContext
from hybrid_pd.proxy.routing.round_robin import RoundRobinPicker
from tests.proxy.routing.helpers import workers


def test_rotates_over_all_when_scores_tie():
    ws = workers("a", "b", "c")
    rr = RoundRobinPicker()
    picks = [rr.pick(RequestContext(), ws, [0.0, 0.0, 0.0]).url for _ in range(7)]
    assert picks == [ws[i % 3].url for i in range(7)]


def test_rotates_only_among_the_best():
    ws = workers("a", "b", "c", "d")
    rr = RoundRobinPicker()
    picks = [rr.pick(RequestContext(), ws, [0.5, 0.9, 0.2, 0.9]).url for _ in range(4)]
    assert picks == [ws[1].url, ws[3].url, ws[1].url, ws[3].url]
