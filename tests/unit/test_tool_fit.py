"""Does a call fit the tools the request declared (envs/tool_fit.py)? Hand-written tools, and BFCL's own; a served
call that does not fit is `invalid_call` whatever comes next (policies/judge/conversations.py)."""

import json

import pytest

from actors.events import ChatMessage, Interaction, ToolCall, ToolSpec
from envs.tool_fit import misfit
from policies.judge.conversations import ConversationBook, signal_of

WEATHER = ToolSpec(
    function={
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "unit": {"type": "string", "enum": ["C", "F"]},
                "hours": {"type": "array", "items": {"type": "integer"}},
            },
            "required": ["city"],
        },
    }
)
OPEN = ToolSpec(function={"name": "log", "parameters": {"type": "object", "properties": {}, "additionalProperties": True}})


def call(name: str, args) -> ToolCall:
    return ToolCall(id="c1", name=name, arguments=args if isinstance(args, str) else json.dumps(args))


def test_a_call_that_fits_is_none():
    assert misfit([call("get_weather", {"city": "Oslo", "days": 3, "unit": "C", "hours": [1, 2]})], [WEATHER]) is None
    assert misfit([call("get_weather", {"city": "Oslo"})], [WEATHER]) is None  # optional ones may be left out
    assert misfit([], [WEATHER]) is None


@pytest.mark.parametrize(
    "name,args,says",
    [
        ("get_forecast", {"city": "Oslo"}, "'get_forecast' is not one of the declared functions"),
        ("get_weather", '{"city": "Oslo"', "not valid JSON"),
        ("get_weather", "[1, 2]", "not a JSON object"),
        ("get_weather", {"days": 3}, "'city' is a required property"),
        ("get_weather", {"city": "Oslo", "country": "NO"}, "'country' was unexpected"),
        ("get_weather", {"city": "Oslo", "days": "3"}, "'3' is not of type 'integer'"),
        ("get_weather", {"city": "Oslo", "unit": "K"}, "'K' is not one of ['C', 'F']"),
        ("get_weather", {"city": "Oslo", "hours": [1, "2"]}, "(at hours/1)"),
    ],
)
def test_what_does_not_fit_and_why(name, args, says):
    why = misfit([call(name, args)], [WEATHER])
    assert why is not None and says in why


def test_the_first_misfit_of_several_calls_is_the_reason():
    why = misfit([call("get_weather", {"city": "Oslo"}), call("get_weather", {"city": 7})], [WEATHER])
    assert why == "get_weather: 7 is not of type 'string' (at city)"


def test_a_schema_keeps_its_word_on_extra_parameters():
    assert misfit([call("log", {"anything": 1})], [OPEN]) is None
    no_props = ToolSpec(function={"name": "ping", "parameters": {}})
    assert misfit([call("ping", {"x": 1})], [no_props]) is None


def test_a_schema_that_is_not_json_schema_cannot_judge():
    odd = ToolSpec(function={"name": "f", "parameters": {"type": "dict", "properties": {"a": {"type": "float"}}}})
    assert misfit([call("f", {"a": "x", "b": 2})], [odd]) is None


def test_a_schema_is_data_nothing_is_fetched_and_what_cannot_judge_fits(monkeypatch):
    import urllib.request

    def no_network(*a, **k):
        raise AssertionError("a client's schema made the check fetch a URL")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    for params in (
        {"type": "object", "properties": {"a": {"$ref": "http://169.254.169.254/latest/meta-data"}}},
        {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}},
        {"$schema": 7, "type": "object"},
        ["not", "a", "schema"],
    ):
        spec = ToolSpec(function={"name": "f", "parameters": {"x": 1}}).model_copy()
        spec.function.parameters = params
        assert misfit([call("f", {"a": 1})], [spec]) is None, params
    local = ToolSpec(
        function={
            "name": "f",
            "parameters": {"type": "object", "properties": {"a": {"$ref": "#/$defs/n"}}, "$defs": {"n": {"type": "integer"}}},
        }
    )
    assert misfit([call("f", {"a": 1})], [local]) is None and "is not of type 'integer'" in misfit(
        [call("f", {"a": "x"})], [local]
    )
    deep = "[" * 100_000 + "]" * 100_000
    assert "nested too deep" in misfit([call("get_weather", '{"city": ' + deep + "}")], [WEATHER])


def test_bfcl_functions_as_clients_declare_them():
    """BFCL v4's own entries: every answer its checker accepts fits (all 789 of the three categories do), and one
    missing a required parameter does not."""
    from envs.bfcl_single import SingleTurnEnvironment, check, reference_calls

    env = SingleTurnEnvironment()
    accepted = 0
    for eid in env.entries("train")[::8]:
        tools = env.episode(eid).tools
        ref = reference_calls(eid)
        if check(eid, ref)[0]:
            accepted += 1
            assert misfit(ref, tools) is None, eid
        spec = next(t for t in tools if t.function.name == ref[0].name)
        required = spec.function.parameters.get("required") or []
        if required:
            args = json.loads(ref[0].arguments)
            args.pop(required[0], None)
            assert "is a required property" in misfit([call(ref[0].name, args)], tools)
    assert accepted > 70


def _msg(args='{"city": "Paris", "day": "tomorrow"}'):
    return ChatMessage(role="assistant", tool_calls=[ToolCall(id="call_1", name="get_weather", arguments=args)])


def _it(iid, messages, response):
    ev = Interaction(interaction_id=iid, user_hash="u1", messages=messages, response=response)
    ev.weights_version = "w-000003"
    return ev


def _user(text):
    return ChatMessage(role="user", content=text)


def _tool(text, cid="call_1"):
    return ChatMessage(role="tool", content=text, tool_call_id=cid)


WEATHER_Q = "What is the weather in Paris tomorrow?"


def test_a_call_that_does_not_fit_the_declared_tools_is_wrong_unless_it_evidently_worked():
    """A required parameter left out: `invalid_call` with no next turn, or one that says nothing good (the reason leads
    the hint); a tool result that came back fine or the user's thanks outweighs the schema. What is checked is the
    answer as it was served, not the client's copy of it (a client may drop or repair a call it cannot use)."""
    tools = [
        ToolSpec(
            function={
                "name": "get_weather",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}, "day": {"type": "string"}},
                    "required": ["city", "day"],
                },
            }
        )
    ]
    bad = _msg(args='{"city": "Paris"}')
    why = "tool: Error: get_weather: 'day' is a required property"
    assert signal_of(bad, [], WEATHER_Q, tools) == "invalid_call"
    assert signal_of(bad, [_user("Now book a table.")], WEATHER_Q, tools) == "invalid_call"  # moved on: not evidence
    assert signal_of(bad, [_tool("Error: day missing"), _user("No.")], WEATHER_Q, tools) == "invalid_call"
    assert signal_of(bad, [_tool('{"high": 21}'), _user("Thanks!")], WEATHER_Q, tools) == "thanks"
    assert signal_of(bad, [_tool('{"high": 21}')], WEATHER_Q, tools) == "tool_ok"
    assert signal_of(_msg(), [_user("Now book a table.")], WEATHER_Q, tools) == "abandoned_call"  # fits, never ran
    repaired = _msg()  # the client sent back a repaired call; what was served left `day` out
    assert signal_of(repaired, [_user("Now book a table.")], WEATHER_Q, tools, served=bad) == "invalid_call"

    book = ConversationBook()
    m1 = [_user(WEATHER_Q)]
    book.add(_it("a1", m1, bad).model_copy(update={"tools": tools}), 100.0)
    nxt = _it("a2", m1 + [bad, _user("That is not what I asked.")], ChatMessage(role="assistant", content="ok"))
    (conv, _) = book.add(nxt.model_copy(update={"tools": tools}), 101.0)
    first = conv.steps[0]
    assert (first.signal, first.hint) == ("invalid_call", why + "\nuser: That is not what I asked.")
    assert first.outcome == -0.9

    alone = ConversationBook()
    (c, _) = alone.add(_it("b1", m1, bad).model_copy(update={"tools": tools}), 100.0)
    closed = alone.close(c.conversation_id)
    assert (closed.steps[0].signal, closed.steps[0].hint) == ("invalid_call", why)
