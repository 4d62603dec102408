"""The gate runs while a canary does: the successor is gated against the canary, waits as `passed`, and
takes over once the canary has run `gate.canary_min_s` without feedback against it (or when the canary
goes live on its own verdict); a passed version whose baseline did not go live is superseded.

The broadcaster here runs on a fake bus with fixed gate scores (the real gate and bus are covered by
tests/integration/test_broadcaster.py)."""

import asyncio
import time
from types import SimpleNamespace

from test_live_policy import _policy, _version  # noqa: E402  (tests/unit is on sys.path)

from actors.events import WeightsPromoted, WeightsStatus
from actors.lifecycles import WeightsState as S
from policies.promotion.book import PromotionBook
from policies.promotion.feedback_checks import handoff_verdict
from policies.promotion.models import GateScore


class FakeBus:
    def __init__(self):
        self.events = []

    async def publish(self, ev, weights_version=None):
        self.events.append(ev)


def _broadcaster(tmp_path, min_s=60.0):
    from actors.broadcaster import Broadcaster

    p = _policy(tmp_path)
    p.settings.gate.canary_share, p.settings.gate.canary_min_s, p.settings.gate.canary_max_s = 0.25, min_s, 900
    p.settings.gate.live_after_guard = False  # the pipeline without the hold (the preset's): test_live_after_guard.py
    b = Broadcaster(p.settings, bus=FakeBus())
    b.policy, b.store, b.base_path, b._dirty = p, p.store, p.base, False
    b.book = PromotionBook(tmp_path / "book.json", {"w-000000": S.LIVE}, ["w-000000"])
    b.gated = []  # (candidate, against)
    b._score = lambda version, success=True, counts=None: GateScore(success=0.5, nll=1.0)
    # every candidate passes the first look; every version's first look is cached (nothing to score when idle)
    b.scores = SimpleNamespace(
        looks=({"code": 2}, {"code": 8}), recent=dict, unscored=lambda version: {}, drop_p=lambda cand, live, counts: 0.0
    )  # every shortfall counts (the point rule)
    refs = {"w-000000": None}
    for n in (1, 2, 3):
        refs[f"w-{n:06d}"] = _version(p, n, f"w-{n - 1:06d}")
    return b, refs


async def _publish(b, ref):
    from actors.events import WeightsPublished

    await b.handle_weights_published(WeightsPublished(weights=ref), None)


def _statuses(b, version):
    return [e.status for e in b.bus.events if isinstance(e, WeightsStatus) and e.version == version]


def test_a_successor_is_gated_during_the_canary_and_takes_over_after_the_minimum(tmp_path):
    async def go():
        b, refs = _broadcaster(tmp_path, min_s=60.0)
        await _publish(b, refs["w-000001"])
        await b.tick()  # gated against live: the canary
        assert b.book.status["w-000001"] == S.CANARY and b.policy.pointer().canary.version == "w-000001"
        await _publish(b, refs["w-000002"])
        await b.tick()  # gated against the running canary at once, then waits behind it
        assert b.book.status["w-000002"] == S.PASSED and b.book.passed.against == "w-000001"
        assert b.book.status["w-000001"] == S.CANARY
        gate_ev = [e for e in b.bus.events if isinstance(e, WeightsStatus) and e.version == "w-000002"]
        assert "against canary w-000001" in gate_ev[1].reason
        b.book.canary.started = time.time() - 61  # the canary has run its minimum, no feedback against it
        await b.tick()
        assert b.book.status["w-000001"] == S.LIVE and b.book.status["w-000002"] == S.CANARY
        ptr = b.policy.pointer()
        assert ptr.version == "w-000001" and ptr.canary.version == "w-000002"
        live = [e for e in b.bus.events if isinstance(e, WeightsPromoted) and e.weights.version == "w-000001"][-1]
        assert live.stage == "live" and live.reason.startswith("w-000002 passed its gate against it; no feedback against")
        assert _statuses(b, "w-000002") == [S.STAGED, S.EVALUATING, S.PASSED, S.CANARY]
        assert b.book.canary.baseline == "w-000001" and b.book.passed is None

    asyncio.run(go())


def test_feedback_against_the_canary_holds_the_successor_until_the_canary_is_decided(tmp_path):
    async def go():
        b, refs = _broadcaster(tmp_path, min_s=60.0)
        b.settings.gate.canary_min_feedback = 3
        await _publish(b, refs["w-000001"])
        await b.tick()
        await _publish(b, refs["w-000002"])
        t0 = b.book.canary.started = time.time() - 61
        b.book.rate("w-000001", t0 + 1, -1.0)  # users dislike the canary so far
        b.book.rate("w-000000", t0 + 1, 1.0)
        await b.tick()
        assert b.book.status["w-000002"] == S.PASSED and b.book.status["w-000001"] == S.CANARY  # no handoff
        for _ in range(2):
            b.book.rate("w-000001", t0 + 2, -1.0)
            b.book.rate("w-000000", t0 + 2, 1.0)
        await b.tick()  # the canary's own verdict: rolled back; its successor was gated against it
        assert b.book.status["w-000001"] == S.ROLLED_BACK
        await b.tick()
        assert b.book.status["w-000002"] == S.SUPERSEDED and b.policy.pointer().version == "w-000000"
        ev = [e for e in b.bus.events if isinstance(e, WeightsStatus) and e.version == "w-000002"][-1]
        assert ev.reason == "gated against w-000001, but w-000000 is live"

    asyncio.run(go())


def test_a_canary_that_goes_live_on_its_own_hands_over_to_its_passed_successor_at_once(tmp_path):
    async def go():
        b, refs = _broadcaster(tmp_path, min_s=None)  # never cut short
        await _publish(b, refs["w-000001"])
        await b.tick()
        await _publish(b, refs["w-000002"])
        b.book.canary.started = time.time() - 600
        await b.tick()
        assert b.book.status["w-000002"] == S.PASSED and b.book.status["w-000001"] == S.CANARY
        b.book.canary.started = time.time() - 901  # canary_max_s: live without evidence
        await b.tick()
        assert b.book.status["w-000001"] == S.LIVE and b.book.status["w-000002"] == S.CANARY
        assert b.book.save() is None and PromotionBook.load(tmp_path / "book.json", "x").canary.version == "w-000002"

    asyncio.run(go())


def test_handoff_verdict():
    kw = {"min_s": 60.0, "margin": 0.3}
    assert handoff_verdict([], [], elapsed_s=59, **kw) == (False, "")
    ok, why = handoff_verdict([1.0], [], elapsed_s=61, **kw)
    assert ok and "after 61s of canary (1 canary / 0 live ratings)" in why
    assert not handoff_verdict([0.0], [1.0, 0.5], elapsed_s=61, **kw)[0]  # 0.75 below live: hold
    assert handoff_verdict([0.6], [1.0, 0.6], elapsed_s=61, **kw)[0]  # 0.2 below: within the margin
    assert not handoff_verdict([1.0], [1.0], elapsed_s=10_000, min_s=None, margin=0.3)[0]


def test_a_gate_cut_short_by_a_restart_is_run_again(tmp_path):
    async def go():
        b, refs = _broadcaster(tmp_path)
        await _publish(b, refs["w-000001"])
        b.book.move("w-000001", S.EVALUATING, "gate started, then kill -9")
        await b._resume_gates()  # what start() does
        assert b.book.status["w-000001"] == S.STAGED
        await b.tick()
        assert b.book.status["w-000001"] == S.CANARY

    asyncio.run(go())


def test_an_idle_broadcaster_scores_the_next_gates_comparator_one_environment_a_tick(tmp_path):
    """A gate needs its comparator's greedy first look (to know where the candidate may fall short); a version
    that passed without its own episodes gets them scored while no gate runs, so its successor's gate waits for
    the successor's scores only. Never while a candidate waits for its gate."""

    async def go():
        b, refs = _broadcaster(tmp_path)
        looks, cached, calls = {"code": 2, "bfcl": 2}, {}, []
        b.scores = SimpleNamespace(
            looks=(looks, {"code": 8, "bfcl": 8}),
            recent=dict,
            drop_p=lambda c, lv, n: 0.0,
            unscored=lambda v: {e: n for e, n in looks.items() if e not in cached.get(v, ())},
        )

        def score(version, success=True, counts=None):
            if success and counts:
                calls.append((version, tuple(counts)))
                cached.setdefault(version, set()).update(counts)
            return GateScore(success=0.0, nll=1.0)  # nothing solved: candidates pass on their likelihood alone

        b._score = score
        await b.tick()
        assert calls == [("w-000000", ("code",))]  # live: the next gate's comparator, one environment a tick
        await b.tick()
        await b.tick()
        assert calls == [("w-000000", ("code",)), ("w-000000", ("bfcl",))]
        await _publish(b, refs["w-000001"])
        await b._prepare()
        assert len(calls) == 2  # a candidate waits: its gate first
        await b.tick()  # gated against live (cached), the canary; then the canary is the next comparator
        assert b.book.status["w-000001"] == S.CANARY and calls[-1] == ("w-000001", ("code",))
        await _publish(b, refs["w-000002"])
        await b.tick()  # gated against the canary (its bfcl scored in the gate), passed: the next comparator
        assert b.book.status["w-000002"] == S.PASSED and calls[-2:] == [("w-000001", ("code", "bfcl")), ("w-000002", ("code",))]

    asyncio.run(go())
