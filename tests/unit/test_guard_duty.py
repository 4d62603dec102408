"""The guard's share of the host (`guard.duty`): after a check of d seconds it offers nothing for d * (1/duty - 1),
except while serving is held, when a check is what releases it."""

import time
from types import SimpleNamespace

import pytest
from pydantic import ValidationError
from test_guard import FakeGuard  # noqa: E402  (tests/unit is on sys.path)

from config.checks import GuardSettings
from policies.promotion.guard import Guard
from policies.promotion.guard_decisions import rest_s
from policies.weights.model_store import BASE_VERSION


def test_rest_is_the_check_time_scaled_to_the_duty():
    assert rest_s(60.0, 1.0) == 0.0  # the default: the next check whenever the guard is idle
    assert rest_s(60.0, 0.25) == pytest.approx(180.0)  # 60 s busy in every 240 s
    assert rest_s(45.0, 0.5) == pytest.approx(45.0)
    assert rest_s(0.0, 0.1) == 0.0


def test_the_duty_is_a_share():
    assert GuardSettings().duty == 1.0
    assert GuardSettings(duty=0.3).duty == 0.3
    for bad in (0.0, -0.5, 1.5):
        with pytest.raises(ValidationError):
            GuardSettings(duty=bad)


def _guard(duty):
    """The real `offer_newest` and `rested` (test_guard's guard without a thread or an engine) at `duty`."""
    g = FakeGuard()
    g.g = GuardSettings(duty=duty)
    return g


def _book(hold=None, checks=None):
    return SimpleNamespace(hold=hold, canary=None, checks=checks or {})


def test_after_a_check_the_guard_rests_unless_serving_is_held():
    g = _guard(0.25)
    g.rested(BASE_VERSION, 300.0)  # scoring the base is not a check: no rest after it
    assert g.rest_until == 0.0
    g.offer_newest(_book(), "w-000001", [])
    assert g.asked == ["w-000001"]
    before = time.monotonic()
    g.rested("w-000001", 40.0)  # 40 s at duty 0.25: 120 s of rest
    assert g.rest_until == pytest.approx(before + 120.0, abs=1.0)
    g.offer_newest(_book(checks={"w-000001": "not_below"}), "w-000002", [])
    assert g.asked == ["w-000001"]  # resting: the newer live version waits
    # serving held (a version found below the base): the newest candidate is checked at once, rested or not
    g.offer_newest(_book(hold="w-000002", checks={"w-000001": "not_below"}), "w-000001", ["w-000003", "w-000004"])
    assert g.asked == ["w-000001", "w-000004"]
    g.rest_until = time.monotonic() - 1.0  # the rest is over
    g.offer_newest(_book(checks={"w-000001": "not_below", "w-000004": "not_below"}), "w-000005", [])
    assert g.asked == ["w-000001", "w-000004", "w-000005"]


def test_at_the_default_duty_the_next_check_follows_at_once():
    g = _guard(1.0)
    g.rested("w-000001", 90.0)
    assert g.rest_until <= time.monotonic()
    g.offer_newest(_book(checks={"w-000001": "not_below"}), "w-000002", [])
    assert g.asked == ["w-000002"]


def _looping(duty, check):
    """A guard whose real `_loop` runs in a thread, with `check` in place of scoring (the base scores at once)."""
    import queue
    import threading

    g = Guard.__new__(Guard)
    g.g = GuardSettings(duty=duty, nice=0)
    g._todo, g._done, g.current, g._busy, g.rest_until, g.error = queue.Queue(maxsize=1), queue.Queue(), None, True, 0.0, ""
    g._base, g.check = lambda: None, check
    threading.Thread(target=g._loop, daemon=True).start()
    _wait(lambda: g.idle)
    assert g.rest_until == 0.0  # no rest after the base
    return g


def _wait(cond, timeout=10.0):
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "the guard's thread did not get there"
        time.sleep(0.01)


def test_the_loop_rests_by_the_check_time_not_the_wall_time():
    from policies.promotion.guard_decisions import Check

    g = _looping(0.25, lambda v: [Check(v, "code", [0.5], [0.5], 1, 4, 8, duration_s=40.0)])
    before = time.monotonic()
    assert g.offer("w-000001")
    _wait(lambda: g.idle and not g._done.empty())
    # the check says it took 40 s (a base scored again after a failure would not count): 120 s of rest
    assert g.rest_until == pytest.approx(before + 120.0, abs=2.0)
    assert g._done.get_nowait().version == "w-000001"


def test_a_failed_check_rests_by_the_time_it_took():
    def broken(v):
        time.sleep(0.05)
        raise FileNotFoundError(f"no weights file for {v}")

    g = _looping(0.5, broken)
    assert g.offer("w-000002")
    _wait(lambda: g.idle and g.error)
    assert "no weights file for w-000002" in g.error
    assert time.monotonic() - 1.0 < g.rest_until < time.monotonic() + 1.0  # ~0.05 s busy: ~0.05 s of rest
