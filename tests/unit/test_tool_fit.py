"""Does a call fit the tools the request declared (envs/tool_fit.py)? Hand-written tools, and BFCL's own."""

import json

import pytest

from actors.events import ToolCall, ToolSpec
from envs.tool_fit import misfit

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
