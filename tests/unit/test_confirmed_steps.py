"""`conversations.teach: confirmed`: only live steps their next turn took well train, and such a step's served call is
its group's reference, every answer of the group checked against it by BFCL's AST checker on the request's own
schema (`envs/live.py`). Hand-written steps and hand-computed values; the actors with doubles for the bus, the engine
and the messages."""

import asyncio

import pytest
from learner_harness import Msg  # tests/ is on sys.path
from live_doubles import FakeEngine, answer, interaction, tool
from test_live_steps import Bus, _attributor, _close_all, _explorer

from actors.events import ChatMessage
from actors.task_events import LiveStep, Rollout
from envs.live import MISFIT, UNSEEN, alternatives, confirmed_alternatives, trajectory
from policies.learning import adca

RIGHT = answer({"city": "Oslo", "days": 3})
OK = ChatMessage(role="tool", tool_call_id="c1", content='{"status": "ok"}')


def _labels(group):
    return [["GOOD" if s.outcome > 0 else "BAD"] for s in group]


def test_a_confirmed_steps_answers_are_checked_against_its_served_call_with_hand_computed_advantages():
    """The tool came back fine and the user moved on (`tool_ok`, 0.2 x 0.4). Alternatives: the same call with the city
    in lower case (BFCL compares strings without case: accepted), another city, the days left out (optional in the
    schema, but the reference gave them) and a text answer. Outcomes 1, 1, 0, 0, 0: mean 0.4, population std
    sqrt(0.24); labels GOOD, GOOD, BAD, BAD, BAD: p mean -0.2, var 0.96. A = 0.1 z + u."""
    step = trajectory(interaction(response=RIGHT), 0.08)
    others = [answer({"city": "oslo", "days": 3}), answer({"city": "Bergen", "days": 3}), answer({"city": "Oslo"})]
    group = confirmed_alternatives(step, [*others, ChatMessage(role="assistant", content="Sunny.")])
    assert [s.outcome for s in group] == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert [s.step_signals for s in group] == [[1.0], [1.0], [-0.5], [-0.5], [-1.0]]  # as practice on client tools
    assert group[0].sample_id == "i1" and group[0].messages == step.messages  # the served step, re-scored
    assert group[2].error and "Bergen" in group[2].error and group[4].error == "no function call"
    adv = [a[0] for a in adca.step_advantages(_labels(group), [s.outcome for s in group], alpha=0.1)]
    z_good, z_bad = 1.2 / 0.96**0.5, -0.8 / 0.96**0.5
    u_right, u_wrong = 0.6 / 0.24**0.5, -0.4 / 0.24**0.5
    want = [0.1 * z_good + u_right] * 2 + [0.1 * z_bad + u_wrong] * 3
    assert adv == pytest.approx(want) and want[0] == pytest.approx(1.347219, abs=1e-6)
    # The table (`teach: all`) ranks the wrong city with the right call in lower case: both fit, neither was served.
    table = alternatives(step, [*others, ChatMessage(role="assistant", content="Sunny.")], "required")
    assert [s.outcome for s in table] == [0.08, UNSEEN, UNSEEN, UNSEEN, MISFIT]


def test_a_step_that_cannot_be_a_reference_is_scored_by_the_table():
    two = ChatMessage(role="assistant", tool_calls=[*RIGHT.tool_calls, *answer({"city": "Bergen"}, cid="c2").tool_calls])
    assert confirmed_alternatives(trajectory(interaction(response=two), 0.08), [RIGHT]) is None  # several calls
    refused = answer({"city": "Oslo", "days": "3"})  # a string where the schema says integer (a tool took it anyway)
    assert confirmed_alternatives(trajectory(interaction(response=refused), 0.08), [RIGHT]) is None
    odd = tool("get_weather", {"city": {"anyOf": [{"type": "string"}, {"type": "null"}]}}, ["city"])
    it = interaction(response=answer({"city": "Oslo"}), tools=(odd,))  # a schema BFCL's checker cannot read
    assert confirmed_alternatives(trajectory(it, 0.08), [RIGHT]) is None


def test_with_teach_confirmed_only_a_step_the_next_turn_took_well_goes_on(tmp_path):
    bus = Bus()
    a = _attributor(tmp_path, bus)
    a.settings.conversations.teach = "confirmed"
    first = interaction(response=RIGHT)
    ask_again = ChatMessage(role="user", content="And in Bergen for 2 days?")
    second = interaction("i2", messages=[*first.messages, first.response, OK, ask_again])
    second = second.model_copy(update={"response": answer({"city": "Bergen", "days": "2"}, cid="c2")})  # misfit
    third = interaction("i3", messages=[*second.messages, second.response, ChatMessage(role="user", content="No, wrong.")])
    for it in (first, second, third):
        asyncio.run(a.handle_interaction(it, Msg()))
    asyncio.run(_close_all(a))
    (task,) = bus.events  # i2 and i3 (calls that do not fit the schema: "days" as a string) train nothing
    assert isinstance(task, LiveStep) and task.signal == "tool_ok" and task.step.outcome == pytest.approx(0.08)
    assert task.entry_id == "i1" and a.signalled == {"tool_ok": 1, "invalid_call": 2}  # every signal still counted


def test_the_explorer_checks_a_confirmed_steps_alternatives_against_the_served_call(tmp_path):
    from policies.judge.live_steps import live_judgement, live_task, step_sample

    answers = ['Oslo", "days": 3}}]</tool_call>', 'Bergen", "days": 3}}]</tool_call>', "x"]
    x = _explorer(tmp_path, answers, **{"conversations.teach": "confirmed"})
    it = interaction(response=RIGHT)
    task = live_task(it, "tool_ok", step_sample(it, 0.08, ""))
    task.weights_version = it.weights_version
    asyncio.run(x.handle_live_step(task, Msg()))
    (r,) = x.bus.events
    assert isinstance(r, Rollout) and [s.outcome for s in r.samples] == [1.0, 1.0, 0.0, 0.0]
    assert r.samples[0].messages == task.step.messages and r.behaviour_versions == ["w-000003"] + ["w-000005"] * 3
    assert r.scored_by == "served-call" and live_judgement(r).judge == "next-turn:tool_ok+served-call"
    # the same step in `teach: all`: the table's scores
    x.settings.conversations.teach = "all"
    x.engine = FakeEngine(answers)
    asyncio.run(x.handle_live_step(task.model_copy(update={"event_id": "t2"}), Msg()))
    assert [s.outcome for s in x.bus.events[-1].samples][:3] == [pytest.approx(0.08), pytest.approx(0.08), UNSEEN]
    assert x.bus.events[-1].scored_by == "tool-fit"
