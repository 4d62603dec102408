"""The attributor's live paths on hand-written data: a step rated twice, or rated after its signal went out in a close
that then failed, trains once; what a live sample and a rated
judgement carry is scrubbed of personal data (tool schemas and comments too), and an interaction whose `add` failed
reaches the book on its redelivery."""

import asyncio

import pytest
from test_conversations import FakeBus, Msg, _agent_conversation, _it, _user  # tests/unit is on sys.path

from actors.events import ChatMessage, Feedback, Judgement, ToolSpec
from policies.judge.conversations import ConversationBook

EMAIL, PHONE = "jane.doe@example.com", "+1 415 555 0100"


def _attributor(tmp_path):
    from actors.attributor import Attributor
    from config.settings import load_settings

    s = load_settings(None)
    s.state_dir = str(tmp_path)
    a = Attributor(s, bus=FakeBus())
    a.book, a.held, a.signalled, a._last_beat = ConversationBook(idle_s=30), {}, {}, 0.0

    async def no_judge(samples, references):  # the judge is out of reach: the rating's sign labels the step
        return [None] * len(samples)

    a.run_judge = no_judge
    return a


def test_a_second_different_rating_is_recorded_but_trains_nothing(tmp_path):
    a = _attributor(tmp_path)
    it = _agent_conversation("ok", "thanks")[0]
    up = Feedback(interaction_id="i1", score=1.0, interaction=it)
    down = Feedback(interaction_id="i1", score=-1.0, comment="changed my mind", interaction=it)

    async def go():
        await a.handle_interaction(it, Msg())
        await a.handle_feedback(up, Msg())
        await a.handle_feedback(down, Msg())
        await a.handle_feedback(up, Msg())  # the first rating redelivered (its ack was lost): published again, same id

    asyncio.run(go())
    judged = [e for e in a.bus.events if isinstance(e, Judgement)]
    assert [j.outcomes for j in judged] == [[1.0], [1.0]] and judged[0].event_id == judged[1].event_id
    assert a.health()["next_turn_signals"] == {"feedback_again": 1}


def test_a_rated_judgements_comment_is_scrubbed(tmp_path):
    a = _attributor(tmp_path)
    it = _agent_conversation("ok", "thanks")[0]
    fb = Feedback(interaction_id="i1", score=-1.0, comment=f"wrong, mail me at {EMAIL} or call {PHONE}", interaction=it)
    asyncio.run(a.handle_feedback(fb, Msg()))
    (j,) = a.bus.events
    assert EMAIL not in j.comments[0] and "555 0100" not in j.comments[0] and "[EMAIL]" in j.comments[0]


def test_live_samples_carry_the_tool_schemas_scrubbed():
    from actors.attributor import live_sample
    from policies.judge.live_steps import step_sample

    tool = ToolSpec(
        function={
            "name": "send_mail",
            "description": f"Mail the report; the owner is {EMAIL}",
            "parameters": {
                "type": "object",
                "properties": {"to": {"type": "string", "enum": [EMAIL], "description": f"or call {PHONE}"}},
                "required": ["to"],
            },
        }
    )
    it = _it("i9", [_user("Mail the report")], ChatMessage(role="assistant", content="Sent.")).model_copy(
        update={"tools": [tool]}
    )
    for s in (live_sample(it, Feedback(interaction_id="i9", score=1.0)), step_sample(it, -0.8, "")):
        (t,) = s.tools
        text = t.model_dump_json()
        assert EMAIL not in text and "555 0100" not in text and "[EMAIL]" in t.function.description
        assert t.function.name == "send_mail" and t.function.parameters["required"] == ["to"]  # keys kept
        assert t.function.parameters["properties"]["to"]["enum"] == ["[EMAIL]"]


def test_an_interaction_whose_add_failed_reaches_the_book_on_redelivery(tmp_path):
    from actors.actor import HOLD

    a = _attributor(tmp_path)
    it = _agent_conversation("ok", "thanks")[0]
    real, calls = a.book.add, {"n": 0}

    def flaky(ev, now):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("book broke")
        return real(ev, now)

    a.book.add = flaky

    async def go():
        with pytest.raises(RuntimeError):
            await a.handle_interaction(it, Msg())  # nak'd by the actor loop
        assert it.event_id not in a.held
        assert await a.handle_interaction(it, Msg()) is HOLD  # the redelivery

    asyncio.run(go())
    assert calls["n"] == 2 and a.book.holds("i1") and it.event_id in a.held


def test_a_rating_after_its_steps_signal_went_out_in_a_close_that_failed_trains_nothing_more(tmp_path):
    """Step i1's signal is published, i2's publish fails: the conversation goes back to the book, still holding i1."""
    a = _attributor(tmp_path)
    a.settings.conversations.alternatives = 0  # each step trains alone, on its signal
    its = _agent_conversation("Error: city not found", "No, that's not what I asked.")
    real, calls = a.bus.publish, {"n": 0}

    async def second_fails(ev, weights_version=None):
        calls["n"] += 1
        if calls["n"] == 2:
            raise ConnectionError("bus down")
        await real(ev, weights_version)

    a.bus.publish = second_fails

    async def go():
        for it in its:
            await a.handle_interaction(it, Msg())
        with pytest.raises(ConnectionError):
            await a._close("i1")
        assert a.book.holds("i1")  # reopened: tried again later
        await a.handle_feedback(Feedback(interaction_id="i1", score=1.0, interaction=its[0]), Msg())
        await a._close("i1")

    asyncio.run(go())
    judged = [e for e in a.bus.events if isinstance(e, Judgement)]
    assert [j.signals for j in judged] == [["tool_error"], ["tool_error"], ["correction"]]  # i1 (again, same id), i2
    assert judged[0].event_id == judged[1].event_id and a.health()["next_turn_signals"]["feedback_after_signal"] == 1
