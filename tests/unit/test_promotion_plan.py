"""Promotion as a pure state machine (`policies/promotion/plan.py`): tables of situations -> the actions to take, with
no bus, no Ray and no files. Versions are written w0, w1, ... (w-000000, w-000001, ...); by default each descends from
the one before. The broadcaster carrying these actions out is covered by test_canary_pipeline.py and test_guard.py."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_guard import _lineage

from actors.events import WeightsPublished, WeightsRef, WeightsStatus
from actors.lifecycles import IllegalTransition
from actors.lifecycles import WeightsState as S
from policies.promotion.book import PromotionBook
from policies.promotion.models import (
    Canary,
    GateOutcome,
    GateScore,
    GoLive,
    Ignore,
    Passed,
    Prune,
    RollBack,
    StartCanary,
    StartGate,
    Supersede,
)
from policies.promotion.plan import comparator_todo, gated, held, plan, published, resumed, undone

NOW = 100_000.0
GATE = SimpleNamespace(
    canary_share=0.25, canary_min_s=60.0, canary_max_s=900.0, canary_min_feedback=3, rollback_margin=0.3, watch_feedback=4
)
GATE.live_after_guard = False  # test_live_after_guard.py: on
OK = GateScore(nll=1.0, success=0.5, envs={"code": 0.5})


def V(short: str) -> str:
    return f"w-{int(short[1:]):06d}"


def lineage(parents: dict[str, str] | None = None):
    """descends(v, w): v is w or was trained from it; each version's parent is the one before unless given."""
    up = {**{V(f"w{n}"): V(f"w{n - 1}") for n in range(1, 10)}, **{V(k): V(p) for k, p in (parents or {}).items()}}
    return _lineage(*up.items())


def book(status: str, history=("w0",), canary=None, passed=None, hold=None, ratings=()) -> PromotionBook:
    """status "w0:live w1:staged"; canary (version, baseline, started seconds ago); passed (version, against);
    ratings [(version, seconds ago, score, how many)]."""
    b = PromotionBook(
        Path("unused.json"), {V(v): S(st) for v, st in (p.split(":") for p in status.split())}, [V(h) for h in history]
    )
    if canary:
        b.canary = Canary(version=V(canary[0]), baseline=V(canary[1]), started=NOW - canary[2])
    if passed:
        b.passed = Passed(version=V(passed[0]), against=V(passed[1]), why="gate ok", cand=OK, live=OK)
    b.hold = hold and V(hold)
    for version, ago, score, n in ratings:
        for _ in range(n):
            b.rate(V(version), NOW - ago, score)
    return b


def brief(actions) -> list[str]:
    """Each action as "Kind version [to | against | baseline]", in short names."""

    def short(v):
        return f"w{int(v[2:])}"

    out = []
    for a in actions:
        other = next((getattr(a, k) for k in ("to", "against", "baseline") if hasattr(a, k)), None)
        out.append(" ".join([type(a).__name__] + [short(v) for v in (getattr(a, "version", None), other) if v]))
    return out


LIVE_W1 = dict(status="w0:retired w1:live", history=("w0", "w1"))
CANARY_W1 = dict(status="w0:live w1:canary", canary=("w1", "w0", 10))


@pytest.mark.parametrize(
    "situation,live,parents,want",
    [
        # nothing to do
        (dict(status="w0:live"), "w0", None, []),
        # the gate: the newest staged version against live; older staged ones are superseded unevaluated
        (dict(status="w0:live w1:staged w2:staged"), "w0", None, ["Supersede w1", "StartGate w2 w0"]),
        # a passed version becomes the canary when nothing runs
        (dict(status="w0:live w1:passed", passed=("w1", "w0")), "w0", None, ["StartCanary w1 w0"]),
        # the canary waits for ratings on both sides of the split...
        (CANARY_W1, "w0", None, []),
        (dict(CANARY_W1, ratings=[("w1", 5, 1.0, 3), ("w0", 5, 1.0, 2)]), "w0", None, []),
        # ... counted from when it started
        (dict(CANARY_W1, ratings=[("w1", 20, -1.0, 3), ("w0", 20, 1.0, 3)]), "w0", None, []),
        # canary_min_feedback ratings on both sides: live unless significantly worse, then rolled back
        (dict(CANARY_W1, ratings=[("w1", 5, 1.0, 3), ("w0", 5, 1.0, 3)]), "w0", None, ["GoLive w1", "Prune"]),
        (dict(CANARY_W1, ratings=[("w1", 5, -1.0, 3), ("w0", 5, 1.0, 3)]), "w0", None, ["RollBack w1 w0"]),
        # canary_max_s without enough ratings: live (it passed the gate)
        (dict(CANARY_W1, canary=("w1", "w0", 901)), "w0", None, ["GoLive w1", "Prune"]),
        # the gate does not wait for the canary: its newest staged successor is gated against it...
        (dict(status="w0:live w1:canary w2:staged", canary=("w1", "w0", 10)), "w0", None, ["StartGate w2 w1"]),
        # ... a staged version that does not descend from the canary waits for it
        (dict(status="w0:live w1:canary w2:staged", canary=("w1", "w0", 10)), "w0", {"w2": "w0"}, []),
        # a passed successor takes over after canary_min_s: the canary goes live, the successor is the canary at once
        (
            dict(status="w0:live w1:canary w2:passed", canary=("w1", "w0", 61), passed=("w2", "w1")),
            "w0",
            None,
            ["GoLive w1", "Prune", "StartCanary w2 w1"],
        ),
        # not before canary_min_s, nor while the canary's ratings so far are rollback_margin below live's
        (dict(status="w0:live w1:canary w2:passed", canary=("w1", "w0", 30), passed=("w2", "w1")), "w0", None, []),
        (
            dict(
                status="w0:live w1:canary w2:passed",
                canary=("w1", "w0", 61),
                passed=("w2", "w1"),
                ratings=[("w1", 5, -1.0, 1), ("w0", 5, 1.0, 1)],
            ),
            "w0",
            None,
            [],
        ),
        # a canary that goes live on its own verdict hands over to its passed successor at once
        (
            dict(status="w0:live w1:canary w2:passed", canary=("w1", "w0", 901), passed=("w2", "w1")),
            "w0",
            None,
            ["GoLive w1", "Prune", "StartCanary w2 w1"],
        ),
        # a passed version whose canary was rolled back is superseded
        (
            dict(
                status="w0:live w1:canary w2:passed",
                canary=("w1", "w0", 10),
                passed=("w2", "w1"),
                ratings=[("w1", 5, -1.0, 3), ("w0", 5, 1.0, 3)],
            ),
            "w0",
            None,
            ["RollBack w1 w0", "Supersede w2"],
        ),
        # the live watch: live's last watch_feedback ratings against those of the version it replaced
        (
            dict(LIVE_W1, status="w0:retired w1:live w2:staged", ratings=[("w1", 5, -1.0, 4), ("w0", 500, 1.0, 4)]),
            "w1",
            None,
            ["RollBack w1 w0"],
        ),  # and nothing else this tick
        (
            dict(LIVE_W1, status="w0:retired w1:live w2:staged", ratings=[("w1", 5, -1.0, 3), ("w0", 500, 1.0, 4)]),
            "w1",
            None,
            ["StartGate w2 w1"],
        ),
        (
            dict(LIVE_W1, status="w0:retired w1:live w2:staged", ratings=[("w1", 5, 1.0, 4), ("w0", 500, 1.0, 4)]),
            "w1",
            None,
            ["StartGate w2 w1"],
        ),
        # the guard holds serving: nothing new is gated or served...
        (dict(status="w0:live w1:staged", hold="w0"), "w0", None, []),
        (dict(status="w0:live w1:canary w2:staged", canary=("w1", "w0", 10), hold="w0"), "w0", None, []),
        # ... while a running canary's verdict still applies
        (dict(CANARY_W1, canary=("w1", "w0", 901), hold="w0"), "w0", None, ["GoLive w1", "Prune"]),
    ],
)
def test_a_tick_decides(situation, live, parents, want):
    b = book(**situation)
    before = json.dumps(b.summary(), default=str), dict(b.status), list(b.history)
    assert brief(plan(b, NOW, GATE, V(live), lineage(parents))) == want
    assert (json.dumps(b.summary(), default=str), b.status, b.history) == before  # the plan only reads the book


def test_reasons_name_what_decided():
    b = book("w0:live w1:canary w2:staged", canary=("w1", "w0", 10))
    (gate,) = plan(b, NOW, GATE, V("w0"), lineage())
    assert gate == StartGate(V("w2"), V("w1"), "held-out gate against canary w-000001")
    b = book("w0:live w1:canary w2:passed", canary=("w1", "w0", 61), passed=("w2", "w1"))
    go, _, canary = plan(b, NOW, GATE, V("w0"), lineage())
    assert go.reason.startswith("w-000002 passed its gate against it; no feedback against it after 61s of canary")
    assert canary == StartCanary(V("w2"), V("w1"), "gate ok", OK, OK, NOW)
    b = book(
        "w0:live w1:canary w2:passed",
        canary=("w1", "w0", 10),
        passed=("w2", "w1"),
        ratings=[("w1", 5, -1.0, 3), ("w0", 5, 1.0, 3)],
    )
    back, sup = plan(b, NOW, GATE, V("w0"), lineage())
    assert back.reason.startswith("canary feedback worse") and sup.reason == "gated against w-000001, but w-000000 is live"


@pytest.mark.parametrize(
    "ok,against,share,canary_age,want",
    [
        (False, "w0", 0.25, None, ["Reject w1", "Prune"]),
        (True, "w0", 0.25, None, ["StartCanary w1 w0"]),
        (True, "w0", 0.0, None, ["GoLive w1", "Prune"]),  # no canary configured
        (True, "w1", 0.25, 10, ["Pass w2 w1"]),  # against the running canary: it waits behind it...
        (True, "w1", 0.25, 61, ["Pass w2 w1", "GoLive w1", "Prune", "StartCanary w2 w1"]),  # ... or takes over now
    ],
)
def test_a_gates_outcome_decides(ok, against, share, canary_age, want):
    cand = "w2" if canary_age else "w1"
    b = book(
        f"w0:live {cand}:evaluating" + (" w1:canary" if canary_age else ""),
        canary=("w1", "w0", canary_age) if canary_age else None,
    )
    g = SimpleNamespace(**{**vars(GATE), "canary_share": share})
    out = gated(b, GateOutcome(V(cand), V(against), ok, "why", OK, OK), NOW, g, V("w0"), lineage())
    assert brief(out) == want


def test_inputs_and_the_guard():
    ref = WeightsRef(version=V("w2"), path="/w2", sha256="x", parent=V("w1"), step=2)
    b = book("w0:retired w1:live w3:staged", history=("w0", "w1"))
    assert brief(published(b, WeightsPublished(weights=ref), V("w1"))) == ["Stage w2"]
    assert published(b, WeightsPublished(weights=ref), V("w1"))[0].reason == (
        "published by the learner (step 2, parent w-000001)"
    )
    assert published(b, WeightsPublished(weights=ref), V("w3")) == [Ignore(V("w2"), V("w3"))]  # older than live
    assert published(b, WeightsPublished(weights=ref.model_copy(update={"version": V("w3")})), V("w1")) == []  # known
    forced = published(b, WeightsPublished(weights=ref, force=True, reason="ops"), V("w1"))
    assert forced == [GoLive(V("w2"), "forced by an operator: ops"), Prune()]
    assert published(b, WeightsPublished(weights=ref, force=True), V("w2")) == []  # live already
    assert brief(resumed(book("w0:live w1:evaluating"))) == ["Restage w1"]
    assert brief(undone([("supersede", V("w3"), None, "r"), ("rollback", V("w2"), V("w1"), "r")])) == [
        "Supersede w3",
        "RollBack w2 w1",
    ]
    hold = book("w0:live w1:staged w2:staged w3:staged", hold="w0")
    assert held(hold, hold.staged()) == [
        Supersede(V(v), "a newer candidate came while serving was held (w-000000)") for v in ("w1", "w2")
    ]
    assert held(book("w0:live w1:staged w2:staged"), [V("w1"), V("w2")]) == []


def test_the_next_gates_comparator_is_scored_while_no_gate_waits():
    def unscored(v):
        return {"code": 2, "bfcl": 2}

    assert comparator_todo(book("w0:live"), V("w0"), [], unscored) == (V("w0"), {"code": 2})
    assert comparator_todo(book("w0:live w1:staged"), V("w0"), [V("w1")], unscored) is None  # a gate waits
    b = book("w0:live w1:canary w2:passed w3:staged", canary=("w1", "w0", 10), passed=("w2", "w1"))
    assert comparator_todo(b, V("w0"), [V("w3")], unscored) == (V("w2"), {"code": 2})  # the passed one is next
    assert comparator_todo(book("w0:live"), V("w0"), [], lambda v: {}) is None


def test_apply_records_a_rollback_and_what_descends_from_it():
    b = book("w0:retired w1:retired w2:live w3:staged w4:staged", history=("w0", "w1", "w2"))
    events = b.apply(RollBack(V("w2"), V("w1"), "dropped"), V("w2"), lineage({"w4": "w1"}))
    assert [(e.version, e.status) for e in events] == [(V("w2"), S.ROLLED_BACK), (V("w1"), S.LIVE), (V("w3"), S.SUPERSEDED)]
    assert all(isinstance(e, WeightsStatus) for e in events) and events[1].reason == "rollback from w-000002"
    assert b.history == [V("w0"), V("w1")] and b.status[V("w4")] == S.STAGED and b.counts["rolled_back"] == 1


def test_apply_retires_the_canary_and_live_when_another_version_goes_live():
    b = book("w0:live w1:canary w2:rejected", canary=("w1", "w0", 10))
    events = b.apply(GoLive(V("w2"), "forced"), V("w0"), lineage())
    assert [(e.version, e.status, e.reason) for e in events] == [
        (V("w1"), S.RETIRED, "w-000002 went live during its canary"),
        (V("w0"), S.RETIRED, "replaced by w-000002"),
        (V("w2"), S.LIVE, "forced"),
    ]
    assert b.canary is None and b.history == [V("w0"), V("w2")] and b.counts["promoted"] == 1
    (bad,) = b.apply(StartGate(V("w0"), V("w2"), "again"), V("w2"), lineage())  # a bug is reported, not raised
    assert isinstance(bad, IllegalTransition) and str(bad).startswith("w-000000: retired -> evaluating")


def test_a_state_file_of_the_earlier_untyped_book_loads_and_is_written_the_same(tmp_path):
    ref = {"version": V("w2"), "path": "/w/2.safetensors", "sha256": "ab", "parent": V("w1"), "step": 2}
    old = {
        "status": {V("w0"): "retired", V("w1"): "canary", V("w2"): "passed"},
        "refs": {V("w2"): ref},
        "history": [V("w0")],
        "canary": {"version": V("w1"), "baseline": V("w0"), "started": 5.0},
        "passed": {
            "version": V("w2"),
            "against": V("w1"),
            "why": "ok",
            "cand": {"nll": 1.1, "success_code": 0.5, "success": 0.5},
            "live": {"nll": 1.2},
        },
        "feedback": {V("w1"): [[6.0, 1.0]]},
        "replicas": {},
        "counts": {"promoted": 1, "rejected": 0, "rolled_back": 0},
        "checks": {},
        "hold": None,
    }
    (tmp_path / "state.json").write_text(json.dumps(old))
    b = PromotionBook.load(tmp_path / "state.json", "unused")
    assert b.canary == Canary(version=V("w1"), baseline=V("w0"), started=5.0)
    assert b.passed.cand == GateScore(nll=1.1, success=0.5, envs={"code": 0.5}) and b.passed.live.success is None
    assert b.refs[V("w2")] == WeightsRef(**ref) and b.descends(V("w2"), V("w1"))
    b.save()
    assert json.loads((tmp_path / "state.json").read_text()) == old
    assert PromotionBook.load(tmp_path / "state.json", "unused") == b
