"""A live step no user rated becomes a group: the explorer re-samples it from the same context, `envs/live.py` scores
the alternatives against the tools the request declared, and the learner trains the group as one. Hand-written
steps and hand-computed values; the actors with doubles for the bus, the engine and the messages."""

import asyncio
import json
import math

import pytest
from learner_harness import Msg  # tests/ is on sys.path
from live_doubles import ASK, WEATHER, FakeEngine, answer, interaction

from actors.events import ChatMessage, Judgement
from actors.task_events import LiveStep, Rollout
from envs.live import MISFIT, UNSEEN, alternative_outcome, alternatives, trajectory
from policies.judge.conversations import ConversationBook
from policies.learning import adca


@pytest.mark.parametrize(
    "alt,served_outcome,choice,outcome,why",
    [
        (answer({"city": "Oslo", "days": 3}), -0.8, "required", UNSEEN, "fits the declared tools"),
        (answer({"days": 3, "city": "Oslo"}), 0.08, "required", UNSEEN, "fits the declared tools"),
        (answer('{"city":"Oslo" , "days": "3"}'), -0.8, "required", -0.8, "the served step again"),  # key order, spaces
        (answer({"days": 3}), -0.8, "required", MISFIT, "'city' is a required property"),
        (answer({"city": "Oslo", "when": "now"}), -0.8, "required", MISFIT, "'when' was unexpected"),
        (ChatMessage(role="assistant", content="It is sunny."), -0.8, "required", MISFIT, "no call where"),
        (ChatMessage(role="assistant", content="It is sunny."), -0.8, "auto", MISFIT, "the served step made one"),
        (answer({"zone": "CET"}, name="get_time"), -0.8, "auto", MISFIT, "not one of the declared functions"),
    ],
)
def test_an_alternative_is_scored_by_what_is_certain_about_it(alt, served_outcome, choice, outcome, why):
    served = answer({"city": "Oslo", "days": "3"})
    got, reason = alternative_outcome(alt, served, served_outcome, [WEATHER], choice)
    assert got == outcome and why in reason


def test_a_corrected_step_and_its_alternatives_make_one_group_with_hand_computed_advantages():
    """The user corrected the served call (outcome -1.0 x 0.8). Its three alternatives: the same call again (-0.8),
    one missing the required city (-0.9, as `invalid_call`) and one that fits (0.0). Outcomes z-normed in the group
    (population std): mean -0.625, std sqrt(0.5275 / 4) = 0.363146; every step BAD, so the step term is 0: A = u."""
    it = interaction()
    step = trajectory(it, -0.8).model_copy(update={"hint": "user: No, I said 3 days as a number."})
    group = alternatives(
        step, [answer({"city": "Oslo", "days": "3"}), answer({"days": 3}), answer({"city": "Oslo", "days": 3})], "required"
    )
    assert [s.outcome for s in group] == [-0.8, -0.8, MISFIT, UNSEEN]
    assert [s.sample_id for s in group] == ["i1", "i1:alt0", "i1:alt1", "i1:alt2"]
    assert [bool(s.hint) for s in group] == [True, False, False, False]  # only the served step has a next turn
    assert all(s.messages[:-1] == step.messages[:-1] and s.step_indices == step.step_indices for s in group)
    assert group[2].error and "required property" in group[2].error
    labels = [["GOOD" if s.outcome > 0 else "BAD"] for s in group]
    adv = adca.step_advantages(labels, [s.outcome for s in group], alpha=0.1)
    std = math.sqrt(0.5275 / 4)
    assert std == pytest.approx(0.363146, abs=1e-6)
    want = [-0.175 / std, -0.175 / std, -0.275 / std, 0.625 / std]
    assert [a[0] for a in adv] == pytest.approx(want) and want == pytest.approx(
        [-0.481900, -0.481900, -0.757271, 1.721071], abs=1e-6
    )


class Bus:
    def __init__(self, backlog=0):
        self.events, self.queued = [], backlog

    async def publish(self, ev, weights_version=None):
        ev.weights_version = weights_version or ev.weights_version
        type(ev).model_validate_json(ev.model_dump_json())  # strict: every field known
        self.events.append(ev)

    async def backlog(self, durable):
        return self.queued


def _attributor(tmp_path, bus):
    from actors.attributor import Attributor
    from config.settings import load_settings

    s = load_settings(None)
    s.state_dir = str(tmp_path)
    a = Attributor(s, bus=bus)
    a.book, a.held, a.signalled, a._last_beat = ConversationBook(idle_s=30), {}, {}, 0.0
    return a


def _close_all(a):
    for c in a.book.open.values():
        c.last_at -= 31
    return a.tick()


def test_the_attributor_sends_a_step_with_declared_tools_to_be_re_sampled_and_judges_the_group_it_gets_back(tmp_path):
    bus = Bus()
    a = _attributor(tmp_path, bus)
    it = interaction(messages=[ChatMessage(role="user", content=ASK + " Mail me at jane.doe@example.com")])
    it.response_format = {"type": "json_object"}  # what the explorer's alternatives follow, as Serve's answer did
    asyncio.run(a.handle_interaction(it, Msg()))
    asyncio.run(_close_all(a))
    (task,) = bus.events
    assert isinstance(task, LiveStep) and task.env == "live" and task.origin == "live" and task.split == "train"
    assert task.signal == "invalid_call" and task.step.outcome == -0.9 and task.weights_version == "w-000003"
    assert task.tool_choice == "required" and task.user_hash == "u1" and task.source_event_ids == [it.event_id]
    assert task.response_format == {"type": "json_object"}
    assert "jane.doe@example.com" not in json.dumps(task.model_dump()) and "[EMAIL]" in task.step.messages[1].content
    assert task.step.hint == "tool: Error: get_weather: '3' is not of type 'integer' (at days)"

    samples = alternatives(task.step, [answer({"city": "Oslo", "days": 3})], task.tool_choice)
    rollout = Rollout(task=task, group_id=task.event_id, samples=samples, behaviour_versions=["w-000003", "w-000005"])
    rollout.weights_version = "w-000005"
    asyncio.run(a.handle_rollout(rollout, Msg()))
    j = bus.events[-1]
    assert isinstance(j, Judgement) and j.source == "live" and j.origin == "live" and j.env == "live"
    assert j.outcomes == [-0.9, 0.0] and j.step_labels == [["BAD"], ["BAD"]] and j.signals == ["invalid_call", "alternative"]
    assert j.behaviour_versions == ["w-000003", "w-000005"] and j.user_hashes == ["u1", "u1"]
    assert j.source_event_ids == [it.event_id, rollout.event_id] and j.judge == "next-turn:invalid_call+tool-fit"


def test_without_tools_or_room_in_the_explorer_the_step_trains_alone(tmp_path):
    full = Bus(backlog=4)  # the explorer has conversations.max_in_flight tasks already
    a = _attributor(tmp_path, full)
    asyncio.run(a.handle_interaction(interaction(), Msg()))
    asyncio.run(_close_all(a))
    no_tools = Bus()
    b = _attributor(tmp_path, no_tools)
    it = interaction(tools=(), response=answer({"city": "Oslo"}))
    nxt = interaction("i2", messages=[*it.messages, it.response, ChatMessage(role="user", content="No, that is wrong.")])
    nxt = nxt.model_copy(update={"tools": [], "response": ChatMessage(role="assistant", content="Sorry.")})
    for x in (it, nxt):
        asyncio.run(b.handle_interaction(x, Msg()))
    asyncio.run(_close_all(b))
    for bus, signal in ((full, "invalid_call"), (no_tools, "correction")):
        (j,) = bus.events
        assert isinstance(j, Judgement) and len(j.samples) == 1 and j.signals == [signal]


def test_a_step_keeps_the_route_it_was_given_when_its_close_is_tried_again(tmp_path):
    from policies.judge.live_steps import step_sample

    bus = Bus()
    a = _attributor(tmp_path, bus)
    it, c = interaction(), a.settings.conversations
    sample = step_sample(it, -0.9, "")
    assert asyncio.run(a._resampled(it, sample, c))
    bus.queued = c.max_in_flight  # the explorer is full now: a step seen for the first time would train alone
    assert asyncio.run(a._resampled(it, sample, c)) and not asyncio.run(a._resampled(interaction("i2"), sample, c))
    big = interaction("i3", messages=[ChatMessage(role="user", content="x" * 200_000)])
    assert not asyncio.run(_attributor(tmp_path / "b", Bus())._resampled(big, step_sample(big, -0.9, ""), c))


def _explorer(tmp_path, outputs: list[str], **overrides):
    """An explorer on a test bus whose engine answers `outputs`, with free (unguided) alternatives."""
    from actors.explorer import Explorer
    from config.settings import load_settings

    s = load_settings(None, **{"conversations.guided_alternatives": 0, **overrides})
    s.state_dir = str(tmp_path)
    x = Explorer(s, bus=Bus())
    x.engine, x.groups = FakeEngine(outputs), 0

    async def follow():
        pass

    x._follow = follow
    return x


def test_the_explorer_re_samples_a_live_step_with_its_newest_weights(tmp_path):
    from actors.bus import Poison
    from policies.judge.live_steps import live_task, step_sample

    x = _explorer(tmp_path, ['Oslo", "days": 3}}]</tool_call>', 'Oslo", "days": "3"}}]</tool_call>', "3}}]</tool_call>"])
    it = interaction()
    task = live_task(it, "correction", step_sample(it, -0.8, "user: No."))
    task.weights_version = it.weights_version
    asyncio.run(x.handle_live_step(task, Msg()))
    (r,) = x.bus.events
    assert isinstance(r, Rollout) and r.weights_version == "w-000005" and r.samples[0] == task.step
    assert r.task == task.model_copy(update={"step": None})  # the step travels once: as the first sample
    assert r.behaviour_versions == ["w-000003"] + ["w-000005"] * 3
    assert [s.outcome for s in r.samples] == [-0.8, UNSEEN, -0.8, MISFIT]
    with pytest.raises(Poison):  # a step that is not one answer after its context
        asyncio.run(
            x.handle_live_step(task.model_copy(update={"step": task.step.model_copy(update={"step_indices": []})}), Msg())
        )
    bad = task.model_copy(update={"tool_choice": {"type": "function", "function": {"name": "rm"}}, "event_id": "t2"})
    asyncio.run(x.handle_live_step(bad, Msg()))  # a tool_choice naming no declared function: the step trains alone
    assert [len(e.samples) for e in x.bus.events] == [4, 1]


def test_the_learner_trains_a_re_sampled_live_step_as_one_group(tmp_path, tiny_dir):
    from learner_harness import make_learner

    from policies.judge.live_steps import live_judgement, live_task, step_sample

    ln = make_learner(tmp_path, tiny_dir)
    it = interaction()
    it.weights_version = "w-000000"
    task = live_task(it, "correction", step_sample(it, -0.8, "user: No."))
    samples = alternatives(task.step, [answer({"city": "Oslo", "days": 3}), answer({"days": 3})], "required")
    r = Rollout(task=task, group_id=task.event_id, samples=samples, behaviour_versions=["w-000000"] * 3)
    r.weights_version = "w-000000"
    j = live_judgement(r)
    m = Msg()
    asyncio.run(ln.handle_judgement(j, m))
    assert ln.live == {} and [g.group_id for g in ln.ready] == [task.event_id]  # not pooled with single steps
    asyncio.run(ln.tick())
    assert ln.trainer.version == "w-000001" and m.acks == 1 and not ln.ready


def test_alternatives_outlive_the_served_step_when_only_it_is_too_stale_to_train():
    from policies.judge.live_steps import live_judgement, live_task, step_sample
    from policies.learning.groups import fresh_part

    it = interaction()
    task = live_task(it, "invalid_call", step_sample(it, -0.9, "tool: Error: days"))
    answers = [answer({"city": "Oslo", "days": 3}), answer({"city": "Oslo", "days": 4}), answer({"days": 3})]
    r = Rollout(task=task, group_id=task.event_id, samples=alternatives(task.step, answers, "required"))
    j = live_judgement(r.model_copy(update={"behaviour_versions": ["w-000003"] + ["w-000009"] * 3}))
    fresh = {"w-000009"}.__contains__
    part = fresh_part(j, fresh, alpha=0.1)
    assert [s.sample_id for s in part.samples] == ["i1:alt0", "i1:alt1", "i1:alt2"] and part.outcomes == [0.0, 0.0, MISFIT]
    assert part.behaviour_versions == ["w-000009"] * 3 and part.signals == ["alternative"] * 3 and len(part.user_hashes) == 3
    assert fresh_part(j, lambda v: True, alpha=0.1) is j
    same = live_judgement(r.model_copy(update={"samples": r.samples[:3], "behaviour_versions": ["w-000003"] + ["w-000009"] * 2}))
    assert fresh_part(same, fresh, alpha=0.1) is None  # two fitting alternatives alike teach nothing
    assert fresh_part(j, lambda v: False, alpha=0.1) is None
