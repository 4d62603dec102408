"""The document the live page shows and `main.py report --json` prints (policies/evaluation/evolution.py): folded from typed
events, the same however the stream is read (all at once, as `report` does, or caught up in pieces, as a replica
does), duplicates skipped."""

import asyncio

import pytest

from actors.events import (
    ChatMessage,
    Experience,
    Feedback,
    HeldoutScored,
    Interaction,
    Judgement,
    LearnerStep,
    Sample,
    WeightsPromoted,
    WeightsPublished,
    WeightsRef,
    WeightsRolledBack,
    WeightsStatus,
    subject_for,
)
from actors.task_events import Rollout, Task
from policies.evaluation.evolution import Evolution, catch_up
from policies.stats import wilson

T = "2026-11-27T10:{:02d}:{:02d}+00:00".format


def _ref(v, parent, step):
    return WeightsRef(version=v, path=f"/w/{v}", sha256="0" * 64, parent=parent, step=step)


def _check(version, avg, base_avg, entries, at, p=0.5, verdict="not_below"):
    return HeldoutScored(
        version=version,
        env="code",
        entries=entries,
        suite_entries=40,
        k=4,
        avg=avg,
        base_avg=base_avg,
        delta=avg - base_avg,
        p_value=p,
        wins=1,
        losses=0,
        verdict=verdict,
        duration_s=300,
        occurred_at=at,
    )


def history() -> list:
    """Two versions through the loop: rollouts judged (one guided by an experience that helped), learner steps,
    a canary that went live, a rejection, a rollback, guard checks, served requests with memory and feedback."""
    task = Task(task_id="t1", env="code", entry_id="e1")
    sample = Sample(sample_id="s", messages=[ChatMessage(role="user", content="2+2?")])
    guided = sample.model_copy(update={"sample_id": "g", "guided": True, "experience_ids": ["x1"]})
    r1 = Rollout(task=task, group_id="g1", samples=[guided, sample], duration_s=40.0, occurred_at=T(0, 0))
    r2 = Rollout(task=task, group_id="g2", samples=[sample, sample], duration_s=60.0, occurred_at=T(0, 30))
    j1 = Judgement(
        group_id="g1",
        source="rollout",
        task_id="t1",
        samples=[guided, sample],
        outcomes=[1.0, 0.0],
        step_labels=[[], []],
        source_event_ids=[r1.event_id],
        occurred_at=T(0, 50),
    )
    j2 = Judgement(
        group_id="g2",
        source="rollout",
        task_id="t1",
        samples=[sample, sample],
        outcomes=[0.0, 1.0],
        step_labels=[[], []],
        source_event_ids=[r2.event_id],
        occurred_at=T(1, 0),
    )
    x1 = Experience(
        experience_id="x1", text="add the numbers, then print", when="2+2?", success=True, origin="env", occurred_at=T(0, 55)
    )
    it = Interaction(
        interaction_id="i1",
        user_hash="u",
        messages=[ChatMessage(role="user", content="2+2?")],
        response=ChatMessage(role="assistant", content="4"),
        experience_ids=["x1"],
        occurred_at=T(1, 5),
    )
    plain = it.model_copy(update={"event_id": "i2-event", "interaction_id": "i2", "experience_ids": []})
    fb = Feedback(interaction_id="i1", score=1.0, occurred_at=T(1, 6))  # names its interaction, stored before it
    return [
        r1,
        r2,
        j1,
        x1,
        j2,
        it,
        plain,
        fb,
        LearnerStep(
            step=1,
            groups=2,
            samples=4,
            loss=0.1,
            mean_reward=0.5,
            grad_norm=1,
            duration_s=30.0,
            source_event_ids=[j1.event_id, j2.event_id],
            occurred_at=T(2, 0),
            metrics={"informative_share": 0.5, "informative_own_share": 0.25, "groups_env": 1.0, "groups_live": 1.0},
        ),
        WeightsPublished(weights=_ref("w-000001", "w-000000", 1), occurred_at=T(2, 10)),
        WeightsStatus(version="w-000001", status="canary", reason="held-out success 0.5 vs 0.25", occurred_at=T(2, 40)),
        WeightsPromoted(
            weights=_ref("w-000001", "w-000000", 1),
            candidate_score=0.5,
            live_score=0.25,
            previous="w-000000",
            stage="canary",
            occurred_at=T(2, 41),
        ),
        WeightsStatus(version="w-000001", status="live", reason="canary feedback fine", occurred_at=T(4, 0)),
        _check("w-000001", 0.10, 0.05, 20, T(5, 0)),  # stopped early; a later full check of it is the newest
        _check("w-000001", 0.125, 0.0625, 40, T(6, 0), p=0.9),
        LearnerStep(
            step=2,
            groups=1,
            samples=2,
            loss=0.2,
            mean_reward=0.0,
            grad_norm=1,
            duration_s=50.0,
            occurred_at=T(7, 0),
            metrics={"informative_share": 0.4, "groups_env": 1.0},
        ),
        WeightsPublished(weights=_ref("w-000002", "w-000001", 2), occurred_at=T(7, 5)),
        WeightsStatus(version="w-000002", status="canary", reason="no worse", occurred_at=T(7, 25)),
        _check("w-000002", 0.0, 0.0625, 40, T(9, 0), p=0.01, verdict="below"),
        WeightsRolledBack(
            from_version="w-000002", to=_ref("w-000001", "w-000000", 1), reason="below the base", occurred_at=T(9, 1)
        ),
    ]


def _stored(events) -> list[tuple[str, bytes]]:
    return [(subject_for(e, "evo"), e.model_dump_json().encode()) for e in events]


def test_the_document():
    evo = Evolution()
    evo.feed(_stored(history()), seq=21)
    v = evo.view()
    assert v["seq"] == 21 and [r["version"] for r in v["rows"]] == ["w-000001", "w-000002"]
    r1, r2 = v["rows"]
    assert r1["gate"].startswith("canary:") and r1["canary"] == "live: canary feedback fine"
    assert r2["canary"] == "rolled back: below the base" and r1["served_after_s"] == pytest.approx(111.0)
    h = v["heldout"]["w-000001"]["code"]  # the newest check of a version, not the early stop before it
    assert (h["avg"], h["n"], h["p_value"], h["verdict"]) == (0.125, 40, 0.9, "not_below")
    assert (h["lo"], h["hi"]) == tuple(round(x, 4) for x in wilson(0.125, 40)) and h["lo"] < h["avg"] < h["hi"]
    assert v["base"]["code"] == {
        "avg": 0.0625,
        "lo": round(wilson(0.0625, 40)[0], 4),
        "hi": round(wilson(0.0625, 40)[1], 4),
        "n": 40,
    }
    c = v["curve"]["code"]
    assert c["version"] == ["w-000000", "w-000001", "w-000002"] and c["step"] == [0, 1, 2]
    assert c["avg"] == [0.0625, 0.125, 0.0] and c["base"] == [0.0625] * 3 and c["verdict"][0] == "base"
    assert c["p_value"] == [None, 0.9, 0.01]
    m = v["memory"]
    assert (m["active"], m["interactions"], m["with_memory"], m["retrieved"], m["guided_samples"]) == (1, 2, 1, 1, 1)
    assert (m["uses"], m["helped"]) == (2, 2)  # its guided sample won its group, and a request it was in got +1
    assert m["top"] == [
        {
            "id": "x1",
            "uses": 2,
            "helped": 2,
            "text": "add the numbers, then print",
            "state": "active",
            "success": True,
            "origin": "env",
        }
    ]
    s = v["signal"]
    assert s["step"] == [1, 2] and s["informative"] == [0.5, 0.4] and s["live"] == [0.5, 0.0]
    stages = {x["stage"]: x for x in v["stages"]}
    assert stages["explore"]["p50"] == 40.0 and stages["explore"]["last"] == 60.0 and stages["explore"]["n"] == 2
    assert stages["judge"]["last"] == 30.0 and stages["learn"]["p90"] == 50.0  # rollout at 0:30, judged at 1:00
    assert stages["gate"]["p50"] == 20.0 and stages["served"]["n"] == 1


def test_feedback_that_carries_its_interaction_as_earlier_releases_did_counts_the_same():
    """Feedback names its interaction (stored on `evo.interaction.<id>` before it); events of earlier releases carry a
    copy of it instead. The memory's counts are the same either way."""
    events = history()
    fb = next(e for e in events if isinstance(e, Feedback))
    it = next(e for e in events if isinstance(e, Interaction) and e.interaction_id == fb.interaction_id)
    assert _stored([it])[0][0] == "evo.interaction.i1"
    earlier = [fb.model_copy(update={"interaction": it}) if e is fb else e for e in events]
    memory = []
    for evs in (events, earlier):
        evo = Evolution()
        evo.feed(_stored(evs), seq=len(evs))
        memory.append(evo.view()["memory"])
    assert memory[0] == memory[1] and (memory[0]["uses"], memory[0]["helped"]) == (2, 2)


def test_caught_up_in_pieces_equals_read_at_once_and_duplicates_are_skipped():
    stored = _stored(history())
    once = Evolution()
    once.feed(stored, seq=len(stored))
    stream = stored[:5] + stored[3:4] + stored[5:]  # a publish retried after the duplicate window: stored twice

    async def read(seq, limit, kinds):  # Bus.stored_since over a list
        return stream[seq : seq + limit], min(len(stream), seq + limit)

    pieces = asyncio.run(catch_up(Evolution(), read, batch=3))
    assert pieces.seq == len(stream)
    assert {**pieces.view(), "seq": 0} == {**once.view(), "seq": 0}


def test_other_kinds_and_bad_payloads_are_skipped():
    evo = Evolution()
    evo.feed([("evo.task", b"{}"), ("evo.heldout_scored", b"not json"), ("evo.learner_step", b'{"kind": "nope"}')], 3)
    v = evo.view()
    assert v["seq"] == 3 and v["rows"] == [] and v["curve"] == {} and v["signal"]["step"] == []
    assert all(s["n"] == 0 and s["p50"] is None for s in v["stages"])
