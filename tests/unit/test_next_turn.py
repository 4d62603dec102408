"""The next turn's rules on phrasings real users and tools produce, each read by hand: which signal a step gets."""

import pytest
from test_conversations import _agent_conversation, _it  # tests/unit is on sys.path

from actors.events import ChatMessage, ToolCall
from policies.judge.conversations import ConversationBook, signal_of
from policies.judge.next_turn import tool_failed

WEATHER = "What's the weather in Paris today?"
CALL = ChatMessage(role="assistant", tool_calls=[ToolCall(id="c1", name="get_weather", arguments='{"city": "Paris"}')])
TEXT = ChatMessage(role="assistant", content="It is sunny.")


def _next(user: str, step: ChatMessage = TEXT) -> str | None:
    return signal_of(step, [ChatMessage(role="user", content=user)], WEATHER)


@pytest.mark.parametrize(
    "user,signal",
    [
        ("No problem, thanks!", "thanks"),
        ("Nope, all good", "moved_on"),
        ("No, that's not what I asked.", "correction"),
        ("Actually, could you also check Lyon?", "moved_on"),
        ("Actually, I meant Paris, Texas.", "correction"),
        ("That's not exactly what I wanted", "correction"),
        ("Not great.", "correction"),
        ("Great, but it still fails", "correction"),
        ("Thanks, but can you also give me the humidity?", "moved_on"),
        ("How do I thank my team for the launch?", "moved_on"),
        ("Find a great restaurant near the Louvre", "moved_on"),
        ("Perfect, now book me a table for two.", "thanks"),
        ("What about the weather tomorrow?", "moved_on"),
        ("What is the weather in Paris today??", "reask"),
        ("weather paris?", "reask"),
        ("Thanks, that is great!", "thanks"),
        ("Not right now, thanks.", "thanks"),
        ("That's not bad at all!", "moved_on"),
        ("No, that's perfect", "moved_on"),
        ("My VPN is not working, can you help?", "moved_on"),
        ("It's not working.", "correction"),
        ("this isn't right", "correction"),
        ("no" + " " * 50_000 + "x", "correction"),  # matched in linear time, cut to MAX_TEXT
    ],
)
def test_what_the_users_next_message_says(user, signal):
    assert _next(user) == signal


def test_a_no_that_answers_the_steps_own_question_is_not_a_correction():
    asked = ChatMessage(role="assistant", content="I found two flights and a hotel. Anything else?")
    assert _next("No, just the flight.", asked) == "moved_on"
    assert _next("No, just the flight.") == "correction"


@pytest.mark.parametrize(
    "result,failed",
    [
        ('{"status": "ok", "error": null}', False),
        ('{"forecast": "sunny", "note": "station not found nearby, used the next one"}', False),
        ('{"error": "city not found"}', True),
        ('{"success": false, "message": "quota"}', True),
        ('{"isError": true, "content": []}', True),
        ('{"status": 404}', True),
        ('{"status": "failed"}', True),
        ("[1, 2, 3]", False),
        ("Error: city 'Paris' not found", True),
        ("Could not connect to the weather service", True),
        ("Traceback (most recent call last):\n  File 'x.py'\nKeyError: 'city'", True),
        ("Top 10 restaurants in Paris\n...\nPage 2 not found? Try the search.", False),
        ("Sunny, 21 degrees; no rain expected", False),
        ('"Error: city not found"', True),  # a client that JSON-encodes its tool's text
        ('[{"error": "city not found"}]', True),
        ("line 1: import json\nline 2: except KeyError: pass\n" + "line\n" * 10 + "end of file", False),
    ],
)
def test_which_tool_results_report_a_failure(result, failed):
    assert tool_failed(result) is failed
    after = [ChatMessage(role="tool", tool_call_id="c1", content=result)]
    assert signal_of(CALL, after, WEATHER) == ("tool_error" if failed else "tool_ok")


def test_tool_ok_needs_every_parallel_call_answered():
    two = ChatMessage(
        role="assistant",
        tool_calls=[ToolCall(id="c1", name="get_weather", arguments="{}"), ToolCall(id="c2", name="get_time", arguments="{}")],
    )
    one = [ChatMessage(role="tool", tool_call_id="c1", content="sunny")]
    both = one + [ChatMessage(role="tool", tool_call_id="c2", content="12:00")]
    assert signal_of(two, one, WEATHER) is None
    assert signal_of(two, both, WEATHER) == "tool_ok"
    assert signal_of(two, [ChatMessage(role="tool", tool_call_id="c2", content="Error: no clock")], WEATHER) == "tool_error"


def test_a_system_message_that_changes_each_request_does_not_split_the_conversation():
    def sys(t):
        return ChatMessage(role="system", content=f"You are a helpful agent. Current time: 10:0{t}.")

    its = _agent_conversation('{"forecast": "sunny"}', "Thanks!")
    its = [_it(it.interaction_id, [sys(i), *it.messages], it.response) for i, it in enumerate(its)]
    book = ConversationBook()
    convs = [book.add(it, float(i))[0] for i, it in enumerate(its)]
    assert convs[0] is convs[1] is convs[2]
    assert [s.signal for s in convs[0].steps] == ["tool_ok", "thanks", None]


def test_an_explicit_conversation_key_joins_a_history_the_client_cut():
    m1 = [ChatMessage(role="user", content=WEATHER)]
    m2 = [*m1, CALL, ChatMessage(role="tool", tool_call_id="c1", content='{"forecast": "sunny"}')]
    cut = [
        ChatMessage(role="user", content="(earlier turns summarised) Paris weather"),
        TEXT,
        ChatMessage(role="user", content="Thanks!"),
    ]
    for key, joined in (("thread-7", True), ("", False)):
        book = ConversationBook()
        a, _ = book.add(_it("i1", m1, CALL, conversation=key), 1.0)
        book.add(_it("i2", m2, TEXT, conversation=key), 2.0)
        c, _ = book.add(_it("i3", cut, TEXT, conversation=key), 3.0)
        assert (a is c) is joined
        assert [st.signal for st in a.steps] == (["tool_ok", "thanks", None] if joined else ["tool_ok", None])


def test_with_an_explicit_key_a_later_request_that_comes_first_still_waits_for_its_earlier_one():
    its = [_it(it.interaction_id, it.messages, it.response, conversation="t1") for it in _agent_conversation("ok", "Thanks!")]
    book = ConversationBook()
    for it in (its[0], its[2], its[1]):  # redelivered out of order after a restart
        book.add(it, 1.0)
    (conv,) = book.open.values()
    assert [s.interaction.interaction_id for s in conv.steps] == ["i1", "i2", "i3"]
    assert [s.signal for s in conv.steps] == ["tool_ok", "thanks", None]


def test_a_retry_of_an_earlier_request_does_not_take_the_newest_steps_signal():
    its = [_it(it.interaction_id, it.messages, it.response, conversation="t1") for it in _agent_conversation("ok", "No, wrong.")]
    book = ConversationBook()
    for it in its[:2]:
        book.add(it, 1.0)
    retry = _it("i2b", its[1].messages, ChatMessage(role="assistant", content="Sunny."), conversation="t1")
    conv, _ = book.add(retry, 2.0)  # request 2 again (a timeout): a conversation of its own, no signal borrowed
    assert conv.conversation_id == "i2b" and book.open["i1"].steps[-1].signal is None


@pytest.mark.parametrize(
    "user,signal",
    [
        ("Never mind, what time is it in Lyon?", "abandoned_call"),  # declined the approval, changed course
        ("Thanks, I will look it up myself.", "abandoned_call"),  # not positive: the call never ran
        ("No, that's wrong: Paris, Texas.", "correction"),  # a correction still comes first
        (WEATHER, "reask"),  # and so does a re-ask
    ],
)
def test_a_call_the_conversation_went_on_without_is_abandoned(user, signal):
    assert _next(user, CALL) == signal
    two = CALL.model_copy(update={"tool_calls": [*CALL.tool_calls, ToolCall(id="c2", name="get_time", arguments="{}")]})
    one = [ChatMessage(role="tool", tool_call_id="c1", content="sunny"), ChatMessage(role="user", content=user)]
    assert signal_of(two, one, WEATHER) == signal  # one of two calls answered: the other never ran
    assert signal_of(CALL, one, WEATHER) != "abandoned_call"  # every call answered


def test_a_yes_to_the_steps_own_question_is_an_answer_not_a_reask():
    asked = ChatMessage(role="assistant", content="I found a flight at 9:40. Shall I book the flight to Denver?")
    first = "Book a flight to Denver"
    reply = [ChatMessage(role="user", content="Yes, book the flight to Denver")]
    assert signal_of(asked, reply, first) == "moved_on"
    assert signal_of(TEXT, reply, first) == "reask"  # no question asked: the same request again
    wrong = [ChatMessage(role="user", content="That's wrong, book the flight to Denver")]
    assert signal_of(asked, wrong, first) == "correction"  # an explicit correction still counts
