"""Structured output (`response_format`): the grammar a request asks for, refused by name where it cannot be built, and
enforced token by token inside a padded batch whose other rows stay free."""

import json

import jsonschema
import pytest

from actors.events import ToolSpec
from policies.grammar import response_grammar

SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "size": {"enum": ["small", "large"]}},
    "required": ["ok", "size"],
    "additionalProperties": False,
}
TOOL = ToolSpec.model_validate(
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}
)


def test_text_and_forced_calls_need_no_grammar_and_json_asks_for_one():
    assert response_grammar(None) is None and response_grammar({"type": "text"}) is None
    assert response_grammar({"type": "json_object"}, [TOOL], forced=True) is None  # the answer is a call anyway
    assert '"type": "object"' in response_grammar({"type": "json_object"})
    g = response_grammar({"type": "json_schema", "json_schema": {"name": "r", "schema": SCHEMA, "strict": True}}, [TOOL])
    assert '"enum": ["small", "large"]' in g and "<tool_call>" in g and '"const": "get_weather"' in g
    assert '"maxItems"' not in g and '"maxItems": 1' in response_grammar({"type": "json_object"}, [TOOL], one_call=True)


@pytest.mark.parametrize(
    "fmt,words",
    [
        ({"type": "xml"}, "'xml' is not supported"),
        ({"type": "json_schema"}, "needs a json_schema object"),
        ({"type": "json_schema", "json_schema": {"name": "r", "schema": []}}, "must be a JSON Schema object"),
        ({"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "strin"}}}, "strin"),
    ],
)
def test_what_cannot_become_a_grammar_is_refused_by_name(fmt, words):
    with pytest.raises(ValueError, match=words):
        response_grammar(fmt)


def test_a_grammar_is_checked_once_however_often_a_request_asks_for_it():
    from policies import grammar

    fmt = {"type": "json_schema", "json_schema": {"name": "once", "schema": {**SCHEMA, "title": "checked once"}}}
    before = grammar._grammar_error.cache_info()
    assert response_grammar(fmt) == response_grammar(fmt)  # the edge's check, then the turn's grammar
    after = grammar._grammar_error.cache_info()
    assert (after.misses - before.misses, after.hits - before.hits) == (1, 1)
    with pytest.raises(ValueError, match="strin"):  # a refusal is remembered as one too
        response_grammar({"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "strin"}}})


def test_a_schema_s_own_x_guidance_options_join_the_spacing_they_do_not_replace_it():
    g = response_grammar(
        {"type": "json_schema", "json_schema": {"name": "r", "schema": {**SCHEMA, "x-guidance": {"lenient": True}}}}
    )
    opts = json.loads(g.split("%json ", 1)[1])["x-guidance"]
    assert opts == {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ", "lenient": True}


def test_a_grammar_that_cannot_be_built_fails_its_own_call_and_never_the_batch_beside_it(model_dir):
    from policies.engines.engine import TransformersEngine

    eng = TransformersEngine(model_dir, dtype="float32", max_batch=4, batch_window_ms=50)
    with pytest.raises(ValueError, match="the request.s grammar"):
        eng.generate(["p"], 4, grammar="start: %json {")  # refused before it joins a batch
    assert eng.batcher.requests == 0 and eng.generate(["p"], 2)[0].completion_tokens > 0


def _engine(model_dir):
    from policies.engines.engine import TransformersEngine

    return TransformersEngine(model_dir, dtype="float32")


def test_a_constrained_row_writes_json_of_its_schema_beside_a_free_row_that_is_unchanged(model_dir):
    from actors.events import ChatMessage
    from policies.chat import render

    eng = _engine(model_dir)
    ask = render([ChatMessage(role="user", content="Is the sea big? Answer yes or no.")])
    free = render([ChatMessage(role="user", content="Tell me about Paris.")])
    grammar = response_grammar({"type": "json_schema", "json_schema": {"name": "r", "schema": SCHEMA}})
    alone = eng.generate([free], 12)[0]
    both = eng._generate([ask, free], [40, 12], 0.0, 1.0, None, None, [eng.grammars.matcher(grammar), None])
    assert jsonschema.validate(json.loads(both[0].text), SCHEMA) is None and both[0].finish_reason == "stop"
    assert both[1].text == alone.text  # the free row is not masked
    sampled = eng.generate([ask] * 3, 40, temperature=1.0, grammar=grammar)  # sampled at a high temperature: still valid
    for g in sampled:
        assert jsonschema.validate(json.loads(g.text), SCHEMA) is None, g.text


def test_json_object_or_a_call_when_tools_may_still_be_called(model_dir):
    from actors.events import ChatMessage
    from policies.chat import parse_assistant, render

    eng = _engine(model_dir)
    prompt = render([ChatMessage(role="user", content="What is the weather in Paris?")], [TOOL])
    grammar = response_grammar({"type": "json_object"}, [TOOL])

    def json_or_call(text: str) -> bool:
        msg = parse_assistant(text)
        if msg.tool_calls:
            return {c.name for c in msg.tool_calls} == {"get_weather"} and all(  # one call or several (parallel)
                isinstance(json.loads(c.arguments), dict) for c in msg.tool_calls
            )
        return isinstance(json.loads(text), dict)

    greedy = eng.generate([prompt], 64, grammar=grammar)[0]
    assert greedy.finish_reason == "stop" and json_or_call(greedy.text), greedy.text
    for g in eng.generate([prompt] * 4, 64, temperature=1.0, grammar=grammar):  # the budget may cut one off, no more
        assert json_or_call(g.text) if g.finish_reason == "stop" else g.text.startswith(("{", "<tool_call>[{")), g.text
