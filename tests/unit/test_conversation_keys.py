"""Two identical sessions of one user are two conversations: each next request joins one of them, and closing or
joining one leaves the other's key in the book (`ConversationBook.by_key` holds every open conversation of a key,
and `orphans` every one that began with a later request)."""

from test_conversations import _agent_conversation  # tests/unit is on sys.path

from actors.events import ChatMessage, Interaction, ToolCall
from policies.judge.conversations import ConversationBook, step_key

ASK = ChatMessage(role="user", content="What is the weather in Paris tomorrow?")
CALL = ChatMessage(role="assistant", tool_calls=[ToolCall(id="call_1", name="get_weather", arguments='{"city": "Paris"}')])


def _it(iid, messages, response, user="u1"):
    ev = Interaction(interaction_id=iid, user_hash=user, messages=messages, response=response)
    ev.weights_version = "w-000003"
    return ev


def _next(result, iid, answer="Sunny."):
    """The request that carries the call's tool result."""
    msgs = [ASK, CALL, ChatMessage(role="tool", content=result, tool_call_id="call_1")]
    return _it(iid, msgs, ChatMessage(role="assistant", content=answer))


def test_two_identical_sessions_each_get_their_own_next_turn():
    book = ConversationBook()
    a, _ = book.add(_it("a1", [ASK], CALL), 1.0)
    b, _ = book.add(_it("b1", [ASK], CALL), 2.0)  # the same question, the same call: a second tab, say
    assert a is not b and book.by_key[step_key(a.steps[0].interaction)] == ["a1", "b1"]
    first, _ = book.add(_next('{"forecast": "sunny"}', "a2"), 3.0)
    second, _ = book.add(_next("Error: city not found", "b2", "Sorry."), 4.0)
    assert first is a and second is b  # the oldest open one first, then the other: neither is left without its turn
    assert a.steps[0].signal == "tool_ok" and b.steps[0].signal == "tool_error"
    assert [len(c.steps) for c in (a, b)] == [2, 2] and len(book.open) == 2
    # a third identical result finds no open first step left: it starts its own (a retry, or a cut history)
    third, _ = book.add(_next('{"forecast": "sunny"}', "c2"), 5.0)
    assert third is not a and third is not b and len(book.open) == 3


def test_closing_one_of_two_identical_sessions_keeps_the_others_key():
    book = ConversationBook()
    a, _ = book.add(_it("a1", [ASK], CALL), 1.0)
    b, _ = book.add(_it("b1", [ASK], CALL), 2.0)
    closed = book.close("a1")
    assert closed is a and a.steps[0].signal == "abandoned_call"
    book.reopen(a)  # its close could not be carried out: back in the book, still the older of the two
    assert book.by_key[step_key(a.steps[0].interaction)] == ["a1", "b1"]
    book.close("a1")
    joined, _ = book.add(_next('{"forecast": "sunny"}', "b2"), 3.0)
    assert joined is b and b.steps[0].signal == "tool_ok"
    book.close("b1")
    assert not book.by_key and not book.open
    # put back after a close that could not be carried out: findable again
    book.reopen(b)
    assert book.by_key == {step_key(b.steps[-1].interaction): ["b1"]}


def test_two_identical_sessions_redelivered_later_request_first_both_join_up():
    """After a restart the stream may hand back both sessions' second requests before their first ones."""
    book = ConversationBook()
    book.add(_next('{"forecast": "sunny"}', "a2"), 3.0)
    book.add(_next("Error: city not found", "b2", "Sorry."), 4.0)
    assert list(book.orphans.values()) == [["a2", "b2"]]  # two orphans of one parent key: neither replaces the other
    a, _ = book.add(_it("a1", [ASK], CALL), 1.0)
    b, _ = book.add(_it("b1", [ASK], CALL), 2.0)
    assert [[s.interaction.interaction_id for s in c.steps] for c in (a, b)] == [["a1", "a2"], ["b1", "b2"]]
    assert [c.steps[0].signal for c in (a, b)] == ["tool_ok", "tool_error"] and not book.orphans
    assert sorted(book.open) == ["a1", "b1"]


def test_closing_an_orphan_takes_it_off_its_parent_key():
    book = ConversationBook()
    book.add(_next('{"forecast": "sunny"}', "a2"), 3.0)
    book.add(_next('{"forecast": "rain"}', "b2"), 4.0)
    book.close("a2")  # idle before its first request came back: closed alone
    assert list(book.orphans.values()) == [["b2"]]
    joined, _ = book.add(_it("a1", [ASK], CALL), 5.0)
    assert [s.interaction.interaction_id for s in joined.steps] == ["a1", "b2"] and not book.orphans


def test_a_later_request_whose_close_failed_still_waits_for_its_earlier_one():
    its = _agent_conversation("Error: city not found", "No, that's not what I asked.")
    book = ConversationBook()
    book.add(its[1], 2.0)  # request 2 first: it waits for request 1
    book.reopen(book.close("i2"))  # its close could not be carried out (the bus was down): back in the book
    conv, _ = book.add(its[0], 1.0)
    assert [s.interaction.interaction_id for s in conv.steps] == ["i1", "i2"] and list(book.open) == ["i1"]
    assert conv.steps[0].signal == "tool_error" and not book.orphans
