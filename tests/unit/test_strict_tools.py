"""Strict function calling (`"strict": true` on a function tool, as the Agents SDK sends by default): a forced call of
a strict function is decoded under its parameters' grammar, a call list under a response_format grammar holds each
strict function's own schema, an unforced answer is free text or a call block whose strict calls match their schema,
a call that does not match its strict schema never goes out as a call, and a strict schema the compiler refuses is a
400 that names `tools`."""

import json

import jsonschema
import pytest

from actors.events import ChatMessage, RetrieveReply, ToolSpec
from policies.chat import call_opening, tool_choice_prefix
from policies.engines.generation import Generation
from policies.grammar import response_grammar
from serve.interactions import Turn
from serve.schemas import ChatRequest
from serve.wire import BadRequest, parse_chat

PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}

NESTED = {  # as pydantic writes a nested model, the OpenAI Agents SDK keeps its `$defs`
    "type": "object",
    "properties": {"at": {"$ref": "#/$defs/Place"}, "again": {"$ref": "#/properties/at"}},
    "required": ["at", "again"],
    "additionalProperties": False,
    "$defs": {"Place": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
}


def _tool(strict: bool, params=PARAMS, name="get_weather") -> dict:
    return {"type": "function", "function": {"name": name, "parameters": params, "strict": strict}}


def _spec(strict: bool) -> ToolSpec:
    return ToolSpec.model_validate(_tool(strict))


def test_a_forced_call_of_a_strict_function_is_its_arguments_grammar_and_a_loose_one_has_none():
    strict, loose = _spec(True), _spec(False)
    opening = call_opening(strict, grammar=True)
    assert opening == '<tool_call>[{"name": "get_weather", "arguments": ' and call_opening(strict) != opening
    assert call_opening(loose, grammar=True) == call_opening(loose)  # a loose function keeps its opened first argument
    g = response_grammar(None, [strict], opening)
    assert g.startswith('start: arguments "}]</tool_call>"') and '"enum": ["C", "F"]' in g
    assert response_grammar(None, [loose], call_opening(loose, grammar=True)) is None
    named = {"type": "function", "function": {"name": "get_weather"}}
    assert tool_choice_prefix(named, [strict], grammar=True) == opening


def test_a_call_list_under_response_format_holds_each_strict_function_s_own_schema():
    other = ToolSpec.model_validate(_tool(False, {"type": "object", "properties": {}}, name="noop"))
    g = response_grammar({"type": "json_object"}, [_spec(True), other])
    calls = json.loads(g.split('call: "<tool_call>" %json ', 1)[1].rsplit(' "</tool_call>"', 1)[0])
    strict_args, loose_args = (o["properties"]["arguments"] for o in calls["items"]["anyOf"])
    assert strict_args == {"$ref": "#/$defs/f0"} and loose_args == {"type": "object"}
    assert calls["$defs"]["f0"]["required"] == ["city", "unit"]


def test_a_strict_schema_s_own_references_still_point_at_its_parts_in_a_call_list():
    tools = [_spec(True), ToolSpec.model_validate(_tool(True, NESTED, name="go"))]
    g = response_grammar(None, tools)  # compiles: every reference resolves
    calls = json.loads(g.split("calls: %json ", 1)[1])
    assert calls["$defs"]["f1"]["properties"] == {
        "at": {"$ref": "#/$defs/f1.Place"},
        "again": {"$ref": "#/$defs/f1/properties/at"},
    }
    assert calls["$defs"]["f1.Place"]["required"] == ["city"] and "$defs" not in calls["$defs"]["f1"]
    assert response_grammar({"type": "json_object"}, tools)  # and under a response_format


def _answer(text: str, strict: bool):
    req = ChatRequest.model_validate({"messages": [{"role": "user", "content": "weather?"}], "tools": [_tool(strict)]})
    turn = Turn(req=req, messages=[], tools=[_spec(strict)], memory=RetrieveReply(), prompt="p")
    return turn.answer(Generation(text, 3, 9, "stop"))


def test_an_unforced_call_that_does_not_match_its_strict_schema_is_the_model_s_text():
    missing = '<tool_call>[{"name": "get_weather", "arguments": {"city": "Oslo"}}]</tool_call>'
    assert _answer(missing, strict=False).tool_calls[0].name == "get_weather"  # loose: any JSON object runs
    assert _answer(missing, strict=True).tool_calls == [] and _answer(missing, strict=True).content == missing
    whole = '<tool_call>[{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "C"}}]</tool_call>'
    assert json.loads(_answer(whole, strict=True).tool_calls[0].arguments) == {"city": "Oslo", "unit": "C"}


def test_a_strict_schema_the_compiler_refuses_is_a_400_naming_tools():
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [_tool(True, {"type": "object", "properties": {"a": {"type": "strin"}}})],
    }
    with pytest.raises(BadRequest) as err:
        parse_chat(body, 64)
    assert err.value.param == "tools" and "get_weather" in str(err.value)
    _, _, tools, forced = parse_chat({**body, "tools": [_tool(True)], "tool_choice": "required"}, 64)
    assert tools[0].function.strict and forced == '<tool_call>[{"name": "'  # the name is chosen later, by the engine


def test_a_forced_strict_call_decodes_arguments_that_match_its_schema(model_dir):
    from policies.chat import parse_forced, render
    from policies.engines.engine import TransformersEngine

    eng = TransformersEngine(model_dir, dtype="float32")
    spec = _spec(True)
    opening = call_opening(spec, grammar=True)
    prompt = render([ChatMessage(role="user", content="What is the weather in Paris, in Celsius?")], [spec]) + opening
    grammar = response_grammar(None, [spec], opening)
    for g in eng.generate([prompt] * 3, 48, temperature=1.0, grammar=grammar):
        assert g.finish_reason == "stop", g.text
        msg = parse_forced(opening, g.text)
        assert jsonschema.validate(json.loads(msg.tool_calls[0].arguments), PARAMS) is None, g.text


def test_an_unforced_request_with_a_strict_function_decodes_text_or_a_call_that_matches_its_schema(model_dir):
    from policies.chat import parse_assistant, render
    from policies.engines.engine import TransformersEngine

    eng = TransformersEngine(model_dir, dtype="float32")
    spec, loose = _spec(True), ToolSpec.model_validate(_tool(False, {"type": "object", "properties": {}}, name="noop"))
    assert response_grammar(None, [loose]) is None  # nothing strict: free text, as before
    grammar = response_grammar(None, [spec, loose])

    def valid(text: str) -> bool:  # the grammar takes every token of it
        ids = eng.tok.encode(text, add_special_tokens=False)
        return eng.grammars.matcher(grammar).validate_tokens(ids) == len(ids)

    whole = 'Let me look. <tool_call>[{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "C"}}]</tool_call>'
    assert valid("It is sunny in Oslo, <b>22</b> degrees.") and valid(whole) and valid(whole[len("Let me look. ") :])
    assert valid('<tool_call>[{"name": "noop", "arguments": {"any": 1}}]</tool_call>')  # a loose one: any object
    assert not valid('<tool_call>[{"name": "get_weather", "arguments": {"city": "Oslo"}}]</tool_call>')
    assert not valid('<tool_call>[{"name": "delete_all", "arguments": {}}]</tool_call>') and not valid(whole + " more")
    grammar = response_grammar(None, [ToolSpec.model_validate(_tool(True, NESTED, name="go"))])
    assert valid('<tool_call>[{"name": "go", "arguments": {"at": {"city": "Oslo"}, "again": {"city": "Rome"}}}]</tool_call>')
    assert not valid('<tool_call>[{"name": "go", "arguments": {"at": {"town": "Oslo"}, "again": {"city": "Rome"}}}]</tool_call>')
    grammar = response_grammar(None, [spec, loose])
    prompt = render([ChatMessage(role="user", content="What is the weather in Paris, in Celsius?")], [spec, loose])
    for g in eng.generate([prompt] * 4, 64, temperature=1.0, grammar=grammar):
        for c in parse_assistant(g.text).tool_calls if g.finish_reason == "stop" and "<tool_call>" in g.text else ():
            assert c.name == "noop" or jsonschema.validate(json.loads(c.arguments), PARAMS) is None, g.text


@pytest.mark.parametrize("special", [False, True])
def test_a_vocabulary_with_call_tokens_may_write_the_markup_as_those_tokens(model_dir, special):
    """Qwen2.5 and Qwen3 write `<tool_call>` and `</tool_call>` as one added token each (not special to transformers);
    llguidance reads every added token as a special one, which grammar text never matches: without the tokens named
    in the grammar, the model could only spell the markup out. SmolLM2's tokenizer with the two tokens added stands
    in for Qwen's here (no model hub)."""
    from transformers import AutoTokenizer

    from policies.grammar import Grammars, has_call_tokens

    plain, tok = AutoTokenizer.from_pretrained(str(model_dir)), AutoTokenizer.from_pretrained(str(model_dir))
    assert not has_call_tokens(plain)
    tok.add_tokens(["<tool_call>", "</tool_call>"], special_tokens=special)
    assert has_call_tokens(tok)
    grammars = Grammars(tok, tok.eos_token_id)
    opening = call_opening(_spec(True), grammar=True)
    call = '<tool_call>[{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "C"}}]</tool_call>'

    def taken(grammar: str, text: str, spelled: bool = False) -> bool:  # one token each, or spelled out
        ids = (plain if spelled else tok).encode(text, add_special_tokens=False)
        return grammars.matcher(grammar).validate_tokens(ids) == len(ids)

    assert len(tok.encode(call, add_special_tokens=False)) < len(plain.encode(call, add_special_tokens=False))
    text = response_grammar(None, [_spec(True)], call_tokens=True)
    assert taken(text, "Let me look. " + call) and taken(text, call) and taken(text, "Let me look. " + call, spelled=True)
    assert taken(text, "It is sunny.") and not taken(text, call + " more")
    assert not taken(response_grammar(None, [_spec(True)]), call)  # the text-only grammar refuses the tokens
    json_or_call = response_grammar({"type": "json_object"}, [_spec(True)], call_tokens=True)
    assert taken(json_or_call, call) and taken(json_or_call, call, spelled=True) and taken(json_or_call, '{"a": 1}')
    forced = response_grammar(None, [_spec(True)], opening, call_tokens=True)
    assert taken(forced, '{"city": "Oslo", "unit": "C"}}]</tool_call>') and not taken(forced, '{"city": "Oslo"}}]</tool_call>')
