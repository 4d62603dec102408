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
    ],
)
def test_what_the_users_next_message_says(user, signal):
    assert _next(user) == signal


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


def test_an_explicit_conversation_key_joins_a_history_the_client_edited():
    m1 = [ChatMessage(role="user", content=WEATHER)]
    edited = ChatMessage(role="assistant", tool_calls=[ToolCall(id="c9", name="get_weather", arguments='{"city": "Paris, FR"}')])
    m2 = [*m1, edited, ChatMessage(role="tool", tool_call_id="c9", content='{"forecast": "sunny"}')]
    for key, joined in (("thread-7", True), ("", False)):
        book = ConversationBook()
        a, _ = book.add(_it("i1", m1, CALL, conversation=key), 1.0)
        b, _ = book.add(_it("i2", m2, TEXT, conversation=key), 2.0)
        assert (a is b) is joined
        assert a.steps[0].signal == ("tool_ok" if joined else None)


def test_with_an_explicit_key_a_later_request_that_comes_first_still_waits_for_its_earlier_one():
    its = [_it(it.interaction_id, it.messages, it.response, conversation="t1") for it in _agent_conversation("ok", "Thanks!")]
    book = ConversationBook()
    for it in (its[0], its[2], its[1]):  # redelivered out of order after a restart
        book.add(it, 1.0)
    (conv,) = book.open.values()
    assert [s.interaction.interaction_id for s in conv.steps] == ["i1", "i2", "i3"]
    assert [s.signal for s in conv.steps] == ["tool_ok", "thanks", None]
