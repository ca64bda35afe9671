import pytest

from hybrid_pd.proxy.config import Policy
from hybrid_pd.proxy.errors import NoHealthyWorker
from hybrid_pd.proxy.routing import RequestContext, Router
from tests.proxy.routing.helpers import deps, workers


def test_weighted_scores_then_picker():
    ws = workers("a", "b", "c")
    ws[0].in_flight, ws[1].in_flight, ws[2].in_flight = 0, 2, 2
    r = Router("decode", Policy((("least_loaded", 1.0), ("session_affinity", 3.0)), "first"), deps())
    sticky = RequestContext(session="s")
    aff = r.scorers[1][0].score(sticky, ws)
    home = ws[aff.index(1.0)]
    # affinity (weight 3) beats load (weight 1) unless the session's home is the idle one anyway
    assert r.pick(sticky, ws) is home
    assert r.pick(RequestContext(), ws) is ws[0]  # no session: least loaded decides
    assert r.scores(RequestContext(), ws) == [pytest.approx(1 / 4), pytest.approx(1 / 12), pytest.approx(1 / 12)]


def test_no_scorer_is_plain_round_robin():
    ws = workers("a", "b")
    r = Router("prefill", Policy((), "round_robin"), deps())
    assert [r.pick(RequestContext(), ws) for _ in range(4)] == [ws[0], ws[1], ws[0], ws[1]]


def test_no_worker_is_503():
    r = Router("decode", Policy(), deps())
    with pytest.raises(NoHealthyWorker) as e:
        r.pick(RequestContext(), [])
    assert e.value.status == 503
