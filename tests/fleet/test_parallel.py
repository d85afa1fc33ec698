"""fleet.parallel.ordered_map: results in order, never more than 2 x workers in flight."""

import threading
import time

import pytest

from flywheel.fleet.parallel import ordered_map


def test_results_come_in_order_and_in_flight_is_bounded():
    lock, state = threading.Lock(), {"now": 0, "most": 0}

    def work(i):
        with lock:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
        time.sleep(0.002 * (i % 3))
        with lock:
            state["now"] -= 1
        return i * i

    started = []
    items = (started.append(i) or i for i in range(40))
    out = []
    for r in ordered_map(work, items, workers=3, name="t"):
        out.append(r)
        assert len(started) <= len(out) + 6   # never more than 2 x workers submitted ahead
    assert out == [i * i for i in range(40)]
    assert state["most"] <= 3


def test_leaving_early_cancels_the_rest_and_errors_reach_the_caller():
    ran = []
    it = ordered_map(lambda i: ran.append(i) or i, range(1000), workers=2, name="t")
    assert next(it) == 0
    it.close()
    assert len(ran) <= 5
    with pytest.raises(ZeroDivisionError):
        list(ordered_map(lambda i: 1 // (i - 3), range(10), workers=2, name="t"))
    with pytest.raises(ValueError):
        list(ordered_map(abs, [1], workers=0, name="t"))
