"""`main.py report`: the lineage rows built from typed events, and held-out scores compared with the base."""

import json

import pytest

from actors.events import Judgement, LearnerStep, WeightsPromoted, WeightsPublished, WeightsRef, WeightsRolledBack, WeightsStatus
from policies.evaluation import lineage
from policies.evaluation.heldout import HeldoutCache


def _ref(v, parent, step):
    return WeightsRef(version=v, path=f"/w/{v}", sha256="0" * 64, parent=parent, step=step)


def test_lineage_rows_from_events(tmp_path):
    t = "2026-11-24T10:00:{:02d}+00:00".format
    j1, j2 = (
        Judgement(group_id="a", source="rollout", task_id="x", samples=[], outcomes=[], step_labels=[], occurred_at=t(0)),
        Judgement(group_id="b", source="rollout", task_id="y", samples=[], outcomes=[], step_labels=[], occurred_at=t(5)),
    )
    ev = [
        j1,
        j2,
        LearnerStep(
            step=1,
            groups=2,
            samples=8,
            loss=0,
            mean_reward=0,
            grad_norm=0,
            duration_s=4.04,
            source_event_ids=[j1.event_id, j2.event_id],
            occurred_at=t(10),
        ),
        WeightsPublished(weights=_ref("w-000001", "w-000000", 1), occurred_at=t(11)),
        WeightsStatus(version="w-000001", status="evaluating", occurred_at=t(12)),
        WeightsStatus(version="w-000001", status="canary", reason="held-out success 0.5 vs 0.25", occurred_at=t(20)),
        WeightsPromoted(
            weights=_ref("w-000001", "w-000000", 1),
            candidate_score=0.5,
            live_score=0.25,
            previous="w-000000",
            stage="canary",
            occurred_at=t(21),
        ),
        WeightsStatus(version="w-000001", status="live", reason="canary feedback fine", occurred_at=t(40)),
        LearnerStep(step=2, groups=2, samples=8, loss=0, mean_reward=0, grad_norm=0, duration_s=1, occurred_at=t(41)),
        WeightsPublished(weights=_ref("w-000002", "w-000001", 2), occurred_at=t(42)),
        WeightsStatus(version="w-000002", status="rejected", reason="reference NLL 1.5 > live 1.3", occurred_at=t(50)),
        WeightsRolledBack(from_version="w-000001", to=_ref("w-000000", "", 0), reason="feedback dropped", occurred_at=t(59)),
    ]
    rows = lineage.lineage(ev)
    assert [r["version"] for r in rows] == ["w-000001", "w-000002"]
    r1, r2 = rows
    assert r1["parent"] == "w-000000" and r1["gate"].startswith("canary: held-out")
    assert r1["served_after_s"] == pytest.approx(21.0)  # first served 21 s after its oldest judged group
    assert r1["published_after_s"] == pytest.approx(11.0)
    assert r1["step_s"] == 4.0 and r1["gate_s"] == pytest.approx(9.0)  # published at 11, canary at 20
    assert r2["gate_s"] == pytest.approx(8.0)  # a rejection is a decision too
    assert r1["canary"] == "rolled back: feedback dropped"
    assert r2["status"] == "rejected" and r2["gate"].startswith("rejected: reference NLL") and r2["served_after_s"] is None
    text = lineage.table(rows, {"w-000001": {"code": {"avg": 0.5, "delta": 0.25, "p_value": 0.03}}}, {"code": {"avg": 0.25}})
    assert "w-000001" in text and "+25.0" in text and "p=0.030" in text and "rolled back" in text


class _Env:
    def __init__(self, ids):
        self.ids = ids

    def category_of(self, e):
        return e.split("_")[0]


def test_heldout_cache_pairs_versions_on_the_same_entries(tmp_path, monkeypatch):
    import policies.rollout as rollout

    outcomes = {"base": {"a_1": [0, 0], "a_2": [0, 0], "b_1": [1, 0]}, "v1": {"a_1": [1, 1], "a_2": [1, 0], "b_1": [1, 0]}}
    current = {}
    monkeypatch.setattr(
        rollout, "evaluate", lambda engine, env, entries, k, **kw: {"entries": {e: outcomes[current["v"]][e] for e in entries}}
    )
    path = tmp_path / "heldout.json"
    cache = HeldoutCache(path, {"toy": ["a_1", "a_2", "b_1"]}, k=2, temperature=0.7, max_new_tokens=8, call_prefix=True)
    for v in ("base", "v1"):
        current["v"] = v
        cache.evaluate(None, {"toy": _Env([])}, v)
    d = cache.versus("base", "v1")["toy"]
    assert d["avg"] == pytest.approx(2 / 3) and d["base_avg"] == pytest.approx(1 / 6)  # per entry 1, .5, .5 vs 0, 0, .5
    assert d["delta"] == pytest.approx(0.5) and d["wins"] == 2 and d["losses"] == 0
    assert cache.get("v1")["toy"]["categories"] == {"a": 0.75, "b": 0.5}
    d = cache.versus("base", "v1", exclude={"a_1"})["toy"]  # e.g. entries the gate chose versions by
    assert d["n"] == 2 and d["avg"] == pytest.approx(0.5) and d["base_avg"] == pytest.approx(0.25)
    assert d["delta"] == pytest.approx(0.25) and d["wins"] == 1 and d["losses"] == 0
    assert cache.versus("base", "v1", exclude={"a_1", "a_2", "b_1"}) == {}
    again = HeldoutCache(path, {"toy": ["a_1", "a_2", "b_1"]}, k=2, temperature=0.7, max_new_tokens=8, call_prefix=True)
    assert again.get("v1") == cache.get("v1")  # cached under the suite's fingerprint
    other = HeldoutCache(path, {"toy": ["a_1"]}, k=2, temperature=0.7, max_new_tokens=8, call_prefix=True)
    assert other.get("v1") is None and len(json.loads(path.read_text())) == 1


def test_gate_entries_are_the_ones_its_episodes_and_likelihood_use():
    from types import SimpleNamespace

    from policies.promotion.gate import gate_entries

    class Env(_Env):
        def entries(self, split):
            return self.ids if split == "heldout" else ["t_1"]

        def reference_action(self, e):
            return None if e == "a_2" else object()

    class NoRefs(_Env):
        def entries(self, split):
            return self.ids

    envs = {"toy": Env(["a_1", "a_2", "a_3", "a_4"]), "other": NoRefs(["x_1", "x_2"])}
    assert gate_entries(envs, SimpleNamespace(heldout_tasks=1, second_look_tasks=0, nll_entries=2)) == {"a_1", "a_3", "x_1"}
    assert gate_entries(envs, SimpleNamespace(heldout_tasks=1, second_look_tasks=2, nll_entries=1)) == {
        "a_1",
        "a_2",
        "x_1",
        "x_2",
    }


def test_suite_takes_the_first_entries_of_the_chosen_categories():
    from policies.evaluation.heldout import suite

    class Env(_Env):
        def entries(self, split):
            return self.ids if split == "heldout" else []

    envs = {"toy": Env(["a_1", "b_1", "a_2", "b_2", "a_3"]), "other": Env(["x_1", "x_2"])}
    assert suite(envs, 2) == {"toy": ["a_1", "a_2", "b_1", "b_2"], "other": ["x_1", "x_2"]}
    assert suite(envs, {"toy": 3, "other": 1}, {"toy": ["a"]}) == {"toy": ["a_1", "a_2", "a_3"], "other": ["x_1"]}
    assert suite(envs, {"toy": 1}) == {"toy": ["a_1", "b_1"]}  # an environment given 0 entries is left out
    with pytest.raises(ValueError, match="no held-out category"):
        suite(envs, 1, {"toy": ["c"]})


def test_caches_that_share_a_file_keep_each_others_scores(tmp_path):
    """The guard's base (at base_k) and its versions (at k) live in one file, beside `main.py report`'s."""
    path = tmp_path / "heldout.json"
    a = HeldoutCache(path, {"toy": ["a_1"]}, k=8, temperature=0.7, max_new_tokens=8, call_prefix=True)
    b = HeldoutCache(path, {"toy": ["a_1"]}, k=4, temperature=0.7, max_new_tokens=8, call_prefix=True)
    env = {"toy": _Env([])}
    a.put("w-000000", env, {"toy": [0.125]})
    b.put("w-000003", env, {"toy": [0.25]})  # b was made before a wrote: it must not write its old snapshot back
    fresh = [HeldoutCache(path, {"toy": ["a_1"]}, k=k, temperature=0.7, max_new_tokens=8, call_prefix=True) for k in (8, 4)]
    assert fresh[0].get("w-000000")["toy"]["per_entry"] == [0.125]
    assert fresh[1].get("w-000003")["toy"]["per_entry"] == [0.25]
