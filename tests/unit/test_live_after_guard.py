"""`gate.live_after_guard`: a canary goes live only once the guard has checked it no worse than the base. Its
ratings and its time still decide as before; the check is one more condition, so a version below the base reaches
the canary's share of users and never all of them (`policies/promotion/plan.py`, on the book's `checks`)."""

from types import SimpleNamespace

import pytest
from pydantic import ValidationError
from test_promotion_plan import GATE, NOW, OK, V, book, brief, lineage

from config.checks import GateSettings
from config.settings import load_settings
from policies.promotion.models import GateOutcome
from policies.promotion.plan import gated, plan

ON = SimpleNamespace(**{**vars(GATE), "live_after_guard": True})


def checked(b, **verdicts):
    for short, verdict in verdicts.items():
        b.checks[V(short)] = verdict
    return b


@pytest.mark.parametrize(
    "verdicts,want",
    [
        ({}, []),  # past canary_max_s with no rating: it waits for its check...
        ({"w1": "not_below"}, ["GoLive w1", "Prune"]),  # ... and goes live once checked no worse
        ({"w0": "not_below"}, []),  # a check of another version does not count
    ],
)
def test_a_canary_past_its_time_waits_for_its_check(verdicts, want):
    b = checked(book("w0:live w1:canary", canary=("w1", "w0", 901)), **verdicts)
    assert brief(plan(b, NOW, ON, V("w0"), lineage())) == want
    assert brief(plan(b, NOW, GATE, V("w0"), lineage())) == ["GoLive w1", "Prune"]  # off: time alone


def test_the_handoff_waits_for_the_canarys_check_and_says_why():
    situation = dict(status="w0:live w1:canary w2:passed", canary=("w1", "w0", 61), passed=("w2", "w1"))
    assert brief(plan(book(**situation), NOW, ON, V("w0"), lineage())) == []
    go, prune, canary = plan(checked(book(**situation), w1="not_below"), NOW, ON, V("w0"), lineage())
    assert brief([go, prune, canary]) == ["GoLive w1", "Prune", "StartCanary w2 w1"]
    assert go.reason.endswith("; the guard checked it no worse than the base")
    off, _, _ = plan(book(**situation), NOW, GATE, V("w0"), lineage())
    assert "guard" not in off.reason


def test_a_successor_passing_against_an_unchecked_canary_waits_behind_it():
    b = book("w0:live w1:canary w2:evaluating", canary=("w1", "w0", 61))
    out = gated(b, GateOutcome(V("w2"), V("w1"), True, "why", OK, OK), NOW, ON, V("w0"), lineage())
    assert brief(out) == ["Pass w2 w1"]
    b = checked(book("w0:live w1:canary w2:evaluating", canary=("w1", "w0", 61)), w1="not_below")
    out = gated(b, GateOutcome(V("w2"), V("w1"), True, "why", OK, OK), NOW, ON, V("w0"), lineage())
    assert brief(out) == ["Pass w2 w1", "GoLive w1", "Prune", "StartCanary w2 w1"]


def test_worse_ratings_still_roll_an_unchecked_canary_back():
    b = book("w0:live w1:canary", canary=("w1", "w0", 100), ratings=[("w1", 50, -1.0, 3), ("w0", 50, 1.0, 3)])
    assert brief(plan(b, NOW, ON, V("w0"), lineage())) == ["RollBack w1 w0"]


def test_it_needs_the_guard():
    assert load_settings().gate.live_after_guard  # on in the CPU preset
    assert not GateSettings().live_after_guard  # off by default elsewhere (the GPU presets have never run it)
    assert not load_settings(**{"gate.live_after_guard": False}).gate.live_after_guard
    with pytest.raises(ValidationError, match="gate.live_after_guard needs guard.enabled"):
        load_settings(**{"gate.live_after_guard": True, "guard.enabled": False})
