from hybrid_pd.proxy.routing import RequestContext
from hybrid_pd.proxy.routing.first import FirstBestPicker
from tests.proxy.routing.helpers import workers


def test_first_of_the_best_in_configured_order():
    ws = workers("a", "b", "c")
    p = FirstBestPicker()
    assert p.pick(RequestContext(), ws, [0.1, 0.7, 0.7]) is ws[1]
    assert p.pick(RequestContext(), ws, [0.0, 0.0, 0.0]) is ws[0]
    assert p.pick(RequestContext(), ws, [0.0, 0.0, 1.0]) is ws[2]
