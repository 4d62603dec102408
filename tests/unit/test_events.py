import json

import pytest
from pydantic import ValidationError

from actors import events as ev
from actors.task_events import Task


def test_every_kind_has_a_subject_and_round_trips():
    samples = {
        "task": Task(task_id="t", env="bfcl", entry_id="multi_turn_base_1"),
        "feedback": ev.Feedback(interaction_id="i", score=0.5),
        "weights_swapped": ev.WeightsSwapped(replica="r", version="w-000001", swap_ms=3.0),
    }
    for kind in ev.KINDS:
        assert ev.subject_for(kind) == f"evo.{kind}"
    for kind, e in samples.items():
        back = ev.parse_event(e.model_dump_json())
        assert type(back) is type(e) and back == e and back.kind == kind


def test_an_interaction_has_a_subject_of_its_own_and_every_subject_names_its_kind():
    """`evo.interaction.<id>`: the stream's subject index finds an interaction by id. Filters cover the bare
    subject too (events of earlier releases), and a key that is not one subject token makes no subject."""
    it = ev.Interaction(
        interaction_id="chatcmpl-1f0c", user_hash="u", messages=[], response=ev.ChatMessage(role="assistant", content="hi")
    )
    assert ev.subject_for(it) == ev.subject_for("interaction", key="chatcmpl-1f0c") == "evo.interaction.chatcmpl-1f0c"
    assert ev.subjects_of("interaction", "t1") == ["t1.interaction", "t1.interaction.*"]
    assert ev.subjects_of("feedback") == ["evo.feedback"]
    for bad in ("a.b", "*", ">", "", "a b", "x" * 201):
        with pytest.raises(ValueError):
            ev.subject_for("interaction", key=bad)
    with pytest.raises(ValueError):
        ev.subject_for("feedback", key="i1")  # only keyed kinds have per-key subjects
    for kind in ev.KINDS:
        assert ev.kind_of(ev.subject_for(kind)) == kind
    assert ev.kind_of(ev.subject_for(it)) == "interaction" and ev.kind_of("t1.interaction.i1", "t1") == "interaction"
    for other in ("evo.task.x", "evo.nope", "other.task", "evo.interaction.a.b", "evo"):
        assert ev.kind_of(other) is None


def test_design_kinds_are_all_present():
    required = {
        "interaction",
        "feedback",
        "task",
        "rollout",
        "judgement",
        "experience",
        "learner_step",
        "weights_published",
        "weights_promoted",
        "weights_rejected",
        "weights_rolled_back",
        "dead_letter",
    }
    assert required <= set(ev.KINDS)


def test_unknown_kind_and_bad_values_are_rejected():
    with pytest.raises(ValueError):
        ev.subject_for("nope")
    with pytest.raises(ValidationError):
        ev.parse_event(json.dumps({"kind": "nope"}))
    with pytest.raises(ValidationError):
        ev.Feedback(interaction_id="i", score=3.0)


def test_strict_mode_in_tests_forbids_extra_fields():
    data = json.loads(Task(task_id="t", env="bfcl", entry_id="x").model_dump_json())
    data["surprise"] = 1
    with pytest.raises(ValidationError):
        ev.parse_event(json.dumps(data))


def test_envelope_fields():
    e = Task(task_id="t", env="bfcl", entry_id="x")
    for f in ("event_id", "kind", "schema_version", "occurred_at", "producer", "weights_version", "trace_id"):
        assert f in e.model_dump()


def test_derived_ids_keep_their_values_and_are_made_in_one_place():
    """Ids made before an upgrade must match the ones made after (JetStream de-duplication and the learner's applied
    ids rely on them), and only `derived_id` makes them."""
    import uuid
    from pathlib import Path

    from actors.events import derived_id

    assert derived_id("judgement", "e1") == str(uuid.uuid5(uuid.NAMESPACE_URL, "kaizen:judgement:e1"))
    root = Path(__file__).resolve().parents[2]
    makers = [
        str(p.relative_to(root))
        for d in ("actors", "policies", "serve", "deploy", "envs")
        for p in (root / d).rglob("*.py")
        if "uuid5" in p.read_text()
    ]
    assert makers == ["actors/messages.py"]
