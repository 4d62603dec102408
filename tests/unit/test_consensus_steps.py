"""`conversations.teach: consensus`: a live step its next turn turned down has as reference the call a strict majority
of its re-sampled answers give, and every answer of the group is checked against it by BFCL's AST checker on the
request's own schema (`envs/live.py`). Hand-written steps and hand-computed values; the actors with doubles for the
bus, the engine and the messages."""

import asyncio

import pytest
from learner_harness import Msg  # tests/ is on sys.path
from live_doubles import WEATHER, answer, interaction, tool
from test_live_steps import Bus, _attributor, _close_all, _explorer

from actors.events import ChatMessage
from actors.task_events import LiveStep, Rollout
from envs.live import consensus_alternatives, trajectory
from policies.judge.live_steps import live_judgement, live_task, step_sample
from policies.learning import adca

RIGHT, WRONG = answer({"city": "Oslo", "days": 3}), answer({"city": "Bergen", "days": 3})
TEXT = ChatMessage(role="assistant", content="Sunny.")
OK = ChatMessage(role="tool", tool_call_id="c1", content='{"status": "ok"}')


def test_a_turned_down_steps_answers_are_checked_against_the_call_most_of_them_give_with_hand_computed_advantages():
    """The user corrected the served call (Bergen; `correction`, -1 x 0.8). Answers: Oslo, oslo (the same call to
    BFCL's checker, which ignores case), Oslo again, a text answer. Oslo has 3 votes of 4 answers, a strict majority:
    the reference. Outcomes 0, 1, 1, 1, 0: mean 0.6, population std sqrt(0.24); labels BAD, GOOD, GOOD, GOOD, BAD:
    p mean 0.2, var 0.96. A = 0.1 z + u."""
    step = trajectory(interaction(response=WRONG), -0.8)
    group = consensus_alternatives(step, [RIGHT, answer({"city": "oslo", "days": 3}), RIGHT, TEXT])
    assert [s.outcome for s in group] == [0.0, 1.0, 1.0, 1.0, 0.0]
    assert [s.step_signals for s in group] == [[-0.5], [1.0], [1.0], [1.0], [-1.0]]
    assert group[0].sample_id == "i1" and group[0].messages == step.messages and "Bergen" in group[0].error
    labels = [["GOOD" if s.outcome > 0 else "BAD"] for s in group]
    adv = [a[0] for a in adca.step_advantages(labels, [s.outcome for s in group], alpha=0.1)]
    z_good, z_bad = 0.8 / 0.96**0.5, -1.2 / 0.96**0.5
    u_right, u_wrong = 0.4 / 0.24**0.5, -0.6 / 0.24**0.5
    want = [0.1 * z_bad + u_wrong] + [0.1 * z_good + u_right] * 3 + [0.1 * z_bad + u_wrong]
    assert adv == pytest.approx(want) and want[1] == pytest.approx(0.898146, abs=1e-6)


@pytest.mark.parametrize(
    "served,answers,why",
    [
        (WRONG, [RIGHT, answer({"city": "Paris", "days": 3}), answer({"city": "Rome", "days": 3})], "no two agree"),
        (WRONG, [RIGHT, RIGHT, WRONG, answer({"city": "Rome", "days": 3})], "2 of 4 is no strict majority"),
        (RIGHT, [RIGHT, answer({"city": "oslo", "days": 3}), WRONG], "the majority gives what the user turned down"),
        (WRONG, [RIGHT], "one answer is no majority"),
        (WRONG, [answer({"city": "Oslo", "days": "3"})] * 2 + [RIGHT], "answers that do not fit the schema do not vote"),
        (WRONG, [TEXT, TEXT, RIGHT], "text answers do not vote"),
        (WRONG, [TEXT, TEXT, RIGHT, RIGHT], "but they count among the answers: 2 of 4"),
    ],
)
def test_no_reference_without_a_strict_majority_for_another_call(served, answers, why):
    assert consensus_alternatives(trajectory(interaction(response=served), -0.8), answers) is None, why


def test_a_schema_the_checker_cannot_read_gives_no_reference_and_no_votes():
    odd = tool("get_weather", {"city": {"anyOf": [{"type": "string"}, {"type": "null"}]}}, ["city"])
    it = interaction(response=answer({"city": "Bergen"}), tools=(odd,))
    assert consensus_alternatives(trajectory(it, -0.8), [answer({"city": "Oslo"})] * 3) is None
    # beside a readable one: a call of the unreadable function gets no votes, and the readable majority still stands
    clock = tool("get_clock", {"zone": {"anyOf": [{"type": "string"}, {"type": "null"}]}}, [])
    it = interaction(response=WRONG, tools=(WEATHER, clock))
    group = consensus_alternatives(trajectory(it, -0.8), [answer({"zone": "UTC"}, name="get_clock"), RIGHT, RIGHT])
    assert [s.outcome for s in group] == [0.0, 0.0, 1.0, 1.0]


def test_with_teach_consensus_a_turned_down_step_goes_on_only_to_be_re_sampled(tmp_path):
    first = interaction(response=RIGHT)
    again = ChatMessage(role="user", content="And in Bergen for 2 days?")
    second = interaction("i2", messages=[*first.messages, first.response, OK, again])
    second = second.model_copy(update={"response": answer({"city": "Bergen", "days": "2"}, cid="c2")})  # misfit
    for backlog, want, sent in ((0, ["tool_ok", "invalid_call", "invalid_call"], 3), (4, [], 1)):
        bus = Bus(backlog=backlog)
        a = _attributor(tmp_path / str(backlog), bus)
        a.settings.conversations.teach = "consensus"
        third = interaction("i3", messages=[*second.messages, second.response, ChatMessage(role="user", content="No.")])
        for it in (first, second, third):
            asyncio.run(a.handle_interaction(it, Msg()))
        asyncio.run(_close_all(a))
        # the explorer full: the step the next turn took well trains alone, the turned-down ones not at all
        assert [e.signal for e in bus.events if isinstance(e, LiveStep)] == want
        assert len(bus.events) == sent and a.signalled == {"tool_ok": 1, "invalid_call": 2}


def test_the_explorer_scores_a_turned_down_steps_group_by_its_majority_and_drops_one_without(tmp_path):
    answers = ['Oslo", "days": 3}}]</tool_call>', 'oslo", "days": 3}}]</tool_call>', 'Rome", "days": 3}}]</tool_call>']
    x = _explorer(tmp_path, answers, **{"conversations.teach": "consensus"})
    it = interaction(response=WRONG)
    task = live_task(it, "correction", step_sample(it, -0.8, "user: No, Oslo."))
    task.weights_version = it.weights_version
    asyncio.run(x.handle_live_step(task, Msg()))
    (r,) = x.bus.events
    assert isinstance(r, Rollout) and [s.outcome for s in r.samples] == [0.0, 1.0, 1.0, 0.0]
    assert r.samples[0].hint == "user: No, Oslo." and r.behaviour_versions == ["w-000003"] + ["w-000005"] * 3
    assert r.scored_by == "consensus" and live_judgement(r).judge == "next-turn:correction+consensus"
    x.engine.texts = ['Oslo", "days": 3}}]</tool_call>', 'Rome", "days": 3}}]</tool_call>', "x"]
    asyncio.run(x.handle_live_step(task.model_copy(update={"event_id": "t2"}), Msg()))
    assert len(x.bus.events) == 1  # no majority: nothing published, nothing trains
    assert x.health()["live_steps_without_consensus"] == 1
    # a step its next turn took well: the served call is the reference, as with `confirmed`
    x.engine.texts = list(answers)
    ok = interaction("i9", response=RIGHT)
    good = live_task(ok, "tool_ok", step_sample(ok, 0.08, ""))
    good.weights_version = ok.weights_version
    asyncio.run(x.handle_live_step(good, Msg()))
    assert x.bus.events[-1].scored_by == "served-call" and [s.outcome for s in x.bus.events[-1].samples] == [1.0, 1, 1, 0]


@pytest.mark.parametrize("teach,backlog", [("confirmed", 0), ("consensus", 4)])
def test_a_turned_down_step_that_trained_nothing_still_trains_on_a_later_rating(tmp_path, teach, backlog):
    """Dropped at its close (`confirmed`, or `consensus` with the explorer full), the step was never sent on: a rating
    that comes after trains it, and is not taken for one that came after a signal."""
    from actors.events import Feedback, Judgement

    a = _attributor(tmp_path, Bus(backlog=backlog))
    a.settings.conversations.teach = teach
    it = interaction()  # "days" as a string: a call that does not fit, and no next turn
    asyncio.run(a.handle_interaction(it, Msg()))
    asyncio.run(_close_all(a))
    assert a.bus.events == [] and a.signalled == {"invalid_call": 1}

    async def no_judge(samples, refs):
        return [None]

    a.run_judge = no_judge
    asyncio.run(a.handle_feedback(Feedback(interaction_id="i1", score=1.0, interaction=it), Msg()))
    (j,) = a.bus.events
    assert isinstance(j, Judgement) and j.outcomes == [1.0] and "feedback_after_signal" not in a.signalled


def test_a_rating_that_comes_while_a_consensus_step_is_re_sampled_trains_it_and_its_group_is_dropped(tmp_path):
    """Under `consensus` a turned-down step sent to the explorer trains only if its re-samples agree: until its group
    comes back a rating trains it (and the group is then dropped); once the group came back, a rating is refused."""
    from actors.events import Feedback, Judgement

    answers = ['Oslo", "days": 3}}]</tool_call>', 'oslo", "days": 3}}]</tool_call>', 'Rome", "days": 3}}]</tool_call>']

    async def no_judge(samples, refs):
        return [None]

    for rated_first in (True, False):
        a = _attributor(tmp_path / str(rated_first), Bus(backlog=0))
        a.settings.conversations.teach, a.run_judge = "consensus", no_judge
        it = interaction()  # a call that does not fit, and no next turn
        asyncio.run(a.handle_interaction(it, Msg()))
        asyncio.run(_close_all(a))
        (task,) = a.bus.events
        x = _explorer(tmp_path / f"x{rated_first}", answers, **{"conversations.teach": "consensus"})
        asyncio.run(x.handle_live_step(task, Msg()))
        (group,) = x.bus.events  # a majority: the group comes back
        rate = Feedback(interaction_id="i1", score=1.0, interaction=it)
        for step in (rate, group) if rated_first else (group, rate):
            handle = a.handle_feedback if step is rate else a.handle_rollout
            asyncio.run(handle(step, Msg()))
        trained = [e for e in a.bus.events[1:] if isinstance(e, Judgement)]
        assert [j.source for j in trained] == ["live"], trained  # one of the two trains, never both
        assert trained[0].outcomes == ([1.0] if rated_first else [0.0, 1.0, 1.0, 0.0])  # the rating, or the majority
        assert ("rated_while_resampled" in a.signalled) == rated_first
        assert ("feedback_after_signal" in a.signalled) == (not rated_first)
