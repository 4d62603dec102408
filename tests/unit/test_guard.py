"""The guard: served versions checked against the base (sequential, futility stop only), and what a version found
below the base rolls back. Decisions on tables; the broadcaster's hands on a fake bus (as test_canary_pipeline)."""

import asyncio

import pytest
from test_canary_pipeline import _broadcaster, _publish  # noqa: E402  (tests/unit is on sys.path)
from test_live_policy import _version  # noqa: E402

from actors.events import HeldoutScored, WeightsRolledBack, WeightsStatus
from actors.lifecycles import WeightsState as S
from policies.promotion.guard import Guard
from policies.promotion.guard_decisions import Check, anchor, look, rollback_plan


def _check(version, base, n=None):
    return Check("v", "code", list(version), list(base), n or len(version), 4, 16)  # the base sampled 16 times


def test_look_stops_early_only_when_no_loss_so_far():
    base = [0.25, 0.0, 0.5, 0.0, 0.25, 0.0, 0.0, 0.25]
    # half the suite scored, as good as the base there: stop, not below
    assert look(_check([0.5, 0.0, 0.5, 0.0], base[:4], n=8), 0.5, 0.05) == "not_below"
    # a quarter only: go on, whatever it shows
    assert look(_check([1.0, 1.0], base[:2], n=8), 0.5, 0.05) == ""
    # half scored but behind the base: no early verdict either way (futility only)
    assert look(_check([0.0, 0.0, 0.0, 0.0], base[:4], n=8), 0.5, 0.05) == ""
    # the whole suite decides. The base solved 4 of 16 on 6 entries, the version none of 4: per entry, given 4
    # successes among 20 samples, all 4 in the base's 16 has probability C(16,4)/C(20,4) = 1820/4845
    c = _check([0.0] * 8, [0.25] * 6 + [0.0, 0.0])
    assert look(c, 0.5, 0.05) == "below"
    assert c.stats["p_value"] == pytest.approx((1820 / 4845) ** 6) and c.stats["delta"] == pytest.approx(-0.1875)
    assert c.stats["wins"] == 0 and c.stats["losses"] == 6
    # one success in 16 on 5 entries, none in 4: 0.8 ** 5 = 0.33, not significant
    c = _check([0.0] * 8, [1 / 16] * 5 + [0.0] * 3)
    assert look(c, 0.5, 0.05) == "not_below" and c.stats["p_value"] == pytest.approx(0.8**5)
    c2 = _check([0.5, 0.0, 0.5, 0.0], [0.0] * 4, n=8)
    assert look(c2, 0.5, 0.05) == "not_below"
    assert c2.summary() == (
        "code 0.0% -> 25.0% (+25.0 points, p=1.0000, +2/-0, 4 of 8 entries x4 vs the base's x16, stopped early)"
    )


def _lineage(*pairs):
    parent = dict(pairs)

    def descends(v, a):
        while v:
            if v == a:
                return True
            v = parent.get(v)
        return False

    return descends


LINE = _lineage(("w1", "w0"), ("w2", "w1"), ("w3", "w2"), ("w4", "w3"), ("x2", "w1"))


@pytest.mark.parametrize(
    "bad,live,canary,passed,history,checks,want",
    [
        # the checked version is live: back to the newest live version checked no worse
        (
            "w3",
            "w3",
            None,
            None,
            ["w0", "w1", "w2", "w3"],
            {"w1": "not_below", "w3": "below"},
            [("rollback", "w3", "w1", "W; back to w1, the newest live version no worse than the base")],
        ),
        # found below after it was replaced: what descends from it is undone too (canary w4 to live w3, then w3)
        (
            "w2",
            "w3",
            "w4",
            None,
            ["w0", "w1", "w2", "w3"],
            {"w1": "not_below", "w2": "below"},
            [
                ("rollback", "w4", "w3", "descends from w2, W"),
                ("rollback", "w3", "w1", "descends from w2, W; back to w1, the newest live version no worse than the base"),
            ],
        ),
        # nothing checked no worse: the base; the passed successor is superseded first
        (
            "w2",
            "w2",
            "w3",
            "w4",
            ["w0", "w1", "w2"],
            {"w2": "below"},
            [
                ("supersede", "w4", None, "descends from w2, W"),
                ("rollback", "w3", "w2", "descends from w2, W"),
                ("rollback", "w2", "w-000000", "W; back to w-000000, the newest live version no worse than the base"),
            ],
        ),
        # a branch that does not descend from the bad version stays
        ("x2", "w3", None, None, ["w0", "w1", "x2", "w2", "w3"], {"x2": "below"}, []),
        # a served descendant checked no worse itself stays
        ("w2", "w3", None, None, ["w0", "w2", "w3"], {"w2": "below", "w3": "not_below"}, []),
        # a canary checked no worse still ends when the live version it was measured against goes
        (
            "w2",
            "w2",
            "w3",
            None,
            ["w0", "w1", "w2"],
            {"w1": "not_below", "w2": "below", "w3": "not_below"},
            [
                ("rollback", "w3", "w2", "w2, its baseline, goes: W"),
                ("rollback", "w2", "w1", "W; back to w1, the newest live version no worse than the base"),
            ],
        ),
    ],
)
def test_rollback_plan(bad, live, canary, passed, history, checks, want):
    assert rollback_plan(bad, "W", live, canary, passed, history, checks, LINE) == want


def test_categories_are_interleaved_so_a_first_half_holds_each_of_them():
    from policies.promotion.guard_decisions import interleave

    ids = ["add_1", "add_2", "add_3", "mul_1", "mul_2"]
    assert interleave(ids, lambda e: e.split("_")[0]) == ["add_1", "mul_1", "add_2", "mul_2", "add_3"]


def test_no_early_stop_without_a_single_success():
    # half the suite scored, both at zero: no evidence that the version is no worse, so the check goes on
    assert look(_check([0.0] * 4, [0.0] * 4, n=8), 0.5, 0.05) == ""


def test_anchor_is_the_newest_live_version_checked_no_worse():
    assert anchor(["w0", "w1", "w2", "w3"], {"w1": "not_below", "w2": "below", "w3": ""}) == "w1"
    assert anchor(["w0", "w1"], {}) is None


class _Settings:
    class guard:
        suite, per_category, k, base_k, chunk_entries, early_fraction, alpha, batch, nice = (
            {"code": []},
            32,
            4,
            16,
            2,
            0.5,
            0.05,
            8,
            19,
        )


def _guard(tmp_path, base, version, monkeypatch):
    """A Guard whose episodes are replaced by fixed per-entry scores (no engine, no thread)."""
    from policies.evaluation.heldout import HeldoutCache

    g = Guard.__new__(Guard)
    g.g, g.envs, g.current = _Settings.guard, {"code": _Cats()}, None
    g.suite = {"code": [f"e{i}" for i in range(len(base))]}
    g.cache, g.base_cache = (
        HeldoutCache(tmp_path / "heldout.json", g.suite, k=k, temperature=0.7, max_new_tokens=8, call_prefix=True)
        for k in (4, 16)
    )
    g.base_cache.put("w-000000", g.envs, {"code": base})
    g.scored = []
    table = {"v": version}

    def scores(v, env, ids, no):
        g.scored.append((v, no, list(ids)))
        return [table[v][int(e[1:])] for e in ids]

    monkeypatch.setattr(g, "_scores", scores)
    monkeypatch.setattr(g, "_load", lambda v: None)
    return g


class _Cats:
    def category_of(self, e):
        return "add"


def test_a_healthy_version_stops_at_half_the_suite_and_is_not_cached_as_scored(tmp_path, monkeypatch):
    base = [0.25, 0.0, 0.0, 0.25, 0.0, 0.0, 0.5, 0.0]
    g = _guard(tmp_path, base, [0.5, 0.0, 0.25, 0.25, 1.0, 1.0, 1.0, 1.0], monkeypatch)
    (c,) = g.check("v")
    assert c.verdict == "not_below" and len(c.per_entry) == 4 and not c.complete
    assert [no for _, no, _ in g.scored] == [0, 1]  # two chunks of two entries, each with its own seed
    assert g.cache.get("v") is None  # a partial score never enters the full-suite cache


def test_a_version_below_the_base_is_scored_in_full_and_cached(tmp_path, monkeypatch):
    base = [0.25, 0.5, 0.25, 0.25, 0.5, 0.25, 0.0, 0.0]
    g = _guard(tmp_path, base, [0.0] * 8, monkeypatch)
    (c,) = g.check("v")
    # per entry C(16,t)/C(20,t) for the base's t successes: t = 4 on four entries, 8 on two
    assert c.verdict == "below" and c.complete and c.stats["p_value"] == pytest.approx((1820 / 4845) ** 4 * (12870 / 125970) ** 2)
    assert g.cache.get("v")["code"]["per_entry"] == [0.0] * 8
    g.scored.clear()
    (again,) = g.check("v")  # cached: no episode runs
    assert again.verdict == "below" and g.scored == []


class FakeGuard(Guard):
    """The real bookkeeping (results, undo, done, offer_newest) without a thread or an engine."""

    def __init__(self):
        self.offered, self.pending, self.asked = set(), [], []
        self._busy, self.rest_until = False, 0.0
        self._done = __import__("queue").Queue()

    @property
    def idle(self):
        return True

    def offer(self, version):
        self.asked.append(version)
        return True

    def finish(self, c):
        self._done.put(c)

    def health(self):
        return {}


def _verdict(version, verdict):
    base = [0.25] * 6 + [0.0, 0.0]
    c = Check(version, "code", [0.0] * 8 if verdict == "below" else base, base, 8, 4, 16, 90.0)
    c.verdict = look(c, 0.5, 0.05)
    assert c.verdict == verdict
    return c


def test_the_broadcaster_offers_the_newest_served_version_and_rolls_back_a_lineage_below_the_base(tmp_path):
    async def go():
        b, refs = _broadcaster(tmp_path, min_s=0.0)
        b.guard = FakeGuard()
        await _publish(b, refs["w-000001"])
        await b.tick()  # w1 canary
        assert b.guard.asked == ["w-000001"]
        b.guard.finish(_verdict("w-000001", "not_below"))
        await _publish(b, refs["w-000002"])
        await b.tick()  # w2 passed against the canary, hands over: w1 live, w2 canary
        assert b.book.status["w-000001"] == S.LIVE and b.book.status["w-000002"] == S.CANARY
        assert b.book.checks["w-000001"] == "not_below" and b.guard.asked[-1] == "w-000002"
        await _publish(b, refs["w-000003"])
        await b.tick()  # w2 live, w3 canary
        assert b.book.status["w-000002"] == S.LIVE and b.book.status["w-000003"] == S.CANARY
        b.guard.finish(_verdict("w-000002", "below"))
        real = b._rollback

        async def broken(*a):  # the first try fails half-way (the bus, say): the check stays pending
            raise RuntimeError("bus down")

        b._rollback = broken
        with pytest.raises(RuntimeError):
            await b.tick()
        assert b.book.checks.get("w-000002") != "below" and len(b.guard.pending) == 1
        b._rollback = real
        await b.tick()  # carried out on the next tick
        assert not b.guard.pending
        scored = [e for e in b.bus.events if isinstance(e, HeldoutScored)]
        assert [(e.version, e.verdict) for e in scored] == [("w-000001", "not_below"), ("w-000002", "below")]
        assert scored[-1].entries == 8 and scored[-1].delta == pytest.approx(-0.1875)
        rolled = [e for e in b.bus.events if isinstance(e, WeightsRolledBack)]
        assert [(e.from_version, e.to.version) for e in rolled] == [("w-000003", "w-000002"), ("w-000002", "w-000001")]
        assert rolled[0].reason.startswith("descends from w-000002, below the base on held-out code 18.8% -> 0.0%")
        assert "back to w-000001, the newest live version no worse than the base" in rolled[1].reason
        assert b.book.status["w-000003"] == S.ROLLED_BACK and b.book.status["w-000002"] == S.ROLLED_BACK
        assert b.book.status["w-000001"] == S.LIVE and b.policy.pointer().version == "w-000001"
        assert b.policy.pointer().canary is None
        assert "w-000001" in b.book.protected()  # the rollback anchor's file is kept
        assert b.book.history == ["w-000000", "w-000001"]  # what went live after the anchor left the history
        lives = [e for e in b.bus.events if isinstance(e, WeightsStatus) and e.version == "w-000001"]
        assert lives[-1].status == S.LIVE and lives[-1].reason == "rollback from w-000002"
        # serving is held: new candidates are not gated or served until the guard clears one
        assert b.book.hold == "w-000002"
        for n in (4, 5):
            refs[f"w-{n:06d}"] = _version(b.policy, n, "w-000001")
            await _publish(b, refs[f"w-{n:06d}"])
        await b.tick()
        assert b.book.status["w-000004"] == S.SUPERSEDED and b.book.status["w-000005"] == S.STAGED
        assert b.guard.asked[-1] == "w-000005" and b.policy.pointer().version == "w-000001"
        b.guard.finish(_verdict("w-000005", "not_below"))
        await b.tick()  # released
        assert b.book.hold is None
        await b.tick()  # the candidate goes through the gate as usual
        assert b.book.status["w-000005"] == S.CANARY

    asyncio.run(go())
