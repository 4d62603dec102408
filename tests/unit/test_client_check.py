"""A call checked against the reference a task was written from, on a client's own schema, by BFCL's AST checker."""

import json

import pytest
from live_doubles import tool

from actors.events import ToolCall, ToolSpec
from envs.bfcl_single import CATEGORIES, load, reference_calls, to_tool_spec
from envs.bfcl_single import check as bfcl_check
from envs.client_check import Unjudgeable, bfcl_doc, check, possible_answer

AREA = tool(
    "triangle_area",
    {
        "base": {"type": "number"},
        "height": {"type": "integer"},
        "unit": {"type": "string", "default": "cm"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    ["base", "height"],
    "Area of a triangle.",
)


def _call(name, **args):
    return ToolCall(id="c", name=name, arguments=json.dumps(args))


def test_the_reference_becomes_bfcls_possible_answer():
    doc = bfcl_doc(AREA)
    assert doc["parameters"]["properties"]["base"]["type"] == "float"
    assert doc["parameters"]["properties"]["tags"] == {"type": "array", "items": {"type": "string"}}
    assert possible_answer(_call("triangle_area", base=10, height=5), doc) == {
        "triangle_area": {"base": [10.0], "height": [5], "unit": ["cm", ""], "tags": [""]}
    }
    with pytest.raises(Unjudgeable, match="leaves out triangle_area's required"):
        possible_answer(_call("triangle_area", base=10), doc)
    with pytest.raises(Unjudgeable, match="does not describe"):
        possible_answer(_call("triangle_area", base=10, height=5, colour="red"), doc)


@pytest.mark.parametrize(
    "args, right",
    [
        ({"base": 10, "height": 5}, True),  # an integer for a number
        ({"base": 10.0, "height": 5, "unit": "cm"}, True),  # an optional argument at its default
        ({"height": 5, "base": 10.0}, True),
        ({"base": 10, "height": 6}, False),  # a wrong value
        ({"base": 10}, False),  # a required argument left out
        ({"base": 10, "height": 5, "unit": "m"}, False),  # an optional one the reference does not allow
        ({"base": 10, "height": "5"}, False),  # a wrong type
        ({"base": 10, "height": 5, "colour": "red"}, False),  # an argument the function does not have
    ],
)
def test_a_call_is_right_when_it_is_the_reference_call(args, right):
    ok, why = check([_call("triangle_area", **args)], [AREA], _call("triangle_area", base=10, height=5))
    assert ok is right, why
    assert (why == "") is right


def test_strings_compare_as_bfcl_compares_them_and_wrong_shapes_are_rejected_with_a_reason():
    greet = tool("greet", {"city": {"type": "string"}}, ["city"])
    ref = _call("greet", city="New York")
    assert check([_call("greet", city="new york")], [greet], ref)[0]
    assert not check([_call("greet", city="Boston")], [greet], ref)[0]
    assert check([], [greet], ref) == (False, "Wrong number of functions.")
    bad = ToolCall(id="c", name="greet", arguments="{not json")
    assert check([bad], [greet], ref)[1].startswith("arguments of greet are not valid JSON")
    assert "not found" in check([_call("other", city="New York")], [greet], ref)[1]


def test_an_object_default_is_accepted_in_the_checkers_form():
    """An optional object argument the reference leaves out may be given at its default, as BFCL's answers nest it."""
    plot = tool(
        "plot",
        {"x": {"type": "number"}, "style": {"type": "object", "properties": {"c": {"type": "string"}}, "default": {"c": "red"}}},
        ["x"],
    )
    ref = _call("plot", x=1)
    assert check([_call("plot", x=1, style={"c": "red"})], [plot], ref) == (True, "")
    assert not check([_call("plot", x=1, style={"c": "blue"})], [plot], ref)[0]


@pytest.mark.parametrize(
    "schema, why",
    [
        ({"type": "object", "properties": {"x": {"anyOf": [{"type": "string"}]}}}, "uses anyOf"),
        ({"type": "object", "properties": {"x": {"type": ["string", "null"]}}}, "has type"),
        ({"type": "object", "properties": {"x": {"type": "array"}}}, r"x\[\] is not a schema object"),
        ({"type": "object", "properties": {}, "required": ["y"]}, "does not describe"),
    ],
)
def test_a_schema_the_checker_cannot_read_is_not_practised(schema, why):
    spec = ToolSpec.model_validate({"function": {"name": "f", "parameters": schema}})
    with pytest.raises(Unjudgeable, match=why):
        bfcl_doc(spec)


def test_on_bfcl_entries_it_judges_their_reference_calls_as_bfcl_does():
    """Each simple_python entry's function, sent as a client's tool, and its first accepted call as the reference:
    the reference is right, and BFCL's own checker of the entry agrees on a wrong value. (One of the 400 entries'
    first accepted values leaves out a required argument: that reference is not practised.)"""
    entries, _ = load(CATEGORIES[0])
    judged = 0
    for eid in sorted(entries)[:40]:
        spec = to_tool_spec(entries[eid]["function"][0])
        ref = reference_calls(eid)
        try:
            assert check(ref, [spec], ref[0]) == (True, "")
        except Unjudgeable:
            continue
        args = json.loads(ref[0].arguments)
        key = next((k for k, v in args.items() if isinstance(v, int) and not isinstance(v, bool)), None)
        if key is not None:
            wrong = [ToolCall(id="w", name=ref[0].name, arguments=json.dumps({**args, key: args[key] + 1}))]
            assert check(wrong, [spec], ref[0])[0] is False
            assert bfcl_check(eid, wrong)[0] is False
        judged += 1
    assert judged >= 30


def test_several_reference_calls_are_checked_as_bfcl_checks_parallel_calls():
    """One function asked for twice in one answer: each reference call matched once, in any order, nothing more."""
    refs = [_call("triangle_area", base=10, height=5), _call("triangle_area", base=3, height=4)]
    a, b = _call("triangle_area", base=10.0, height=5), _call("triangle_area", base=3, height=4, unit="cm")
    assert check([a, b], [AREA], refs) == (True, "")
    assert check([b, a], [AREA], refs)[0]  # in any order
    for calls, why in (
        ([a], "Wrong number of functions"),  # one of the two left out
        ([a, a], "Invalid value for parameter 'base': 10.0"),  # the same call twice
        ([a, b, b], "Wrong number of functions"),  # one more than asked
        ([a, _call("triangle_area", base=3, height=5)], "Invalid value for parameter 'height': 5"),  # one wrong value
    ):
        ok, reason = check(calls, [AREA], refs)
        assert not ok and why in reason, (calls, reason)
    with pytest.raises(Unjudgeable, match="not among the tools"):
        check([a], [AREA], [refs[0], _call("get_weather", city="Paris")])
