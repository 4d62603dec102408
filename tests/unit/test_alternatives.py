"""A live step's alternatives as the explorer writes them (policies/alternatives.py): as Serve answers the request,
calling the served function, and schema-guided (the required keys forced, the values the model's). A fake engine
records every prompt."""

import json

from live_doubles import TIME, WEATHER, FakeEngine, answer, interaction, tool, weather  # tests/ is on sys.path

from actors.events import ChatMessage, ToolSpec
from envs.live import MISFIT, UNSEEN, alternatives, trajectory


def test_re_samples_are_generated_as_serve_answers_that_request_calling_what_the_served_step_called():
    from policies.alternatives import resample_step
    from policies.chat import render

    step = trajectory(interaction(tools=(WEATHER, TIME)), -0.8)  # the served step called get_weather
    context = render(step.messages[:-1], step.tools)
    eng = FakeEngine(['Oslo", "days": 3}}]</tool_call>', 'Oslo"}}]</tool_call>'])
    answers, tokens = resample_step(eng, step, "required", 2, max_new_tokens=64, temperature=0.9)
    assert not eng.chose and eng.prompts == [context + '<tool_call>[{"name": "get_weather", "arguments": {"city": "'] * 2
    assert [json.loads(a.tool_calls[0].arguments) for a in answers] == [{"city": "Oslo", "days": 3}, {"city": "Oslo"}]
    assert tokens == 10
    # a served text answer: the request's tool_choice decides, as in Serve
    text = trajectory(interaction(tools=(WEATHER, TIME), response=ChatMessage(role="assistant", content="Hm.")), -0.8)
    eng = FakeEngine(['"zone": "CET"}}]</tool_call>', '"zone": "UTC"}}]</tool_call>'])
    answers, _ = resample_step(eng, text, "required", 2, max_new_tokens=64, temperature=0.9)
    assert eng.chose == [['get_weather"', 'get_time"']] * 2  # a declared name by constrained decoding, per answer
    assert all(p.startswith(context + '<tool_call>[{"name": "get_time", "arguments": {') for p in eng.prompts)
    assert [a.tool_calls[0].name for a in answers] == ["get_time", "get_time"]
    eng = FakeEngine(['Oslo"}}]</tool_call>'])
    (named,), _ = resample_step(
        eng, text, {"type": "function", "function": {"name": "get_weather"}}, 1, max_new_tokens=64, temperature=0.9
    )
    assert eng.prompts == [context + '<tool_call>[{"name": "get_weather", "arguments": {"city": "'] and not eng.chose
    assert json.loads(named.tool_calls[0].arguments) == {"city": "Oslo"}
    eng = FakeEngine(["It is sunny."])
    (free,), _ = resample_step(eng, text, "auto", 1, max_new_tokens=64, temperature=0.9)
    assert eng.prompts == [context] and free.content == "It is sunny." and not free.tool_calls


def test_a_guided_alternative_has_every_required_key_forced_and_every_value_written_by_the_model():
    """get_weather requires city (a string) then days (an integer). Row 0 writes both values and closes the call; row 1
    writes no integer where days goes, so it is left as the model wrote it (and does not fit)."""
    from policies.alternatives import resample_step, value_end
    from policies.chat import render

    assert value_end('Oslo", "x": 1}', '"') == 5 and value_end(' 3, "unit": "C"}') == 2 and value_end("1, 2], 3", "[") == 5
    assert value_end('"a": {"b": "}"}}, "c"', "{") == 16 and value_end('say \\"hi\\"", 1', '"') == 11
    assert value_end("three}}") is None and value_end("   ") is None and value_end("NaN}") is None
    tools = (weather("city", "days"),)
    step = trajectory(interaction(tools=tools, response=answer({"city": "Oslo"})), -0.9)
    context = render(step.messages[:-1], step.tools)
    eng = FakeEngine(['Oslo", "and more', 'Bergen"}}]', "3, ", "three}}]</tool_call>", "}}]</tool_call>", 'Oslo"}}]</tool_call>'])
    answers, tokens = resample_step(eng, step, "required", 3, max_new_tokens=64, temperature=0.9, guided=2)
    opening = '<tool_call>[{"name": "get_weather", "arguments": {"city": "'
    assert eng.prompts == [
        context + opening,  # round 1: both rows write city
        context + opening,
        context + opening + 'Oslo", "days": ',  # round 2: days, its key forced
        context + opening + 'Bergen", "days": ',
        context + opening + 'Oslo", "days": 3',  # row 0 goes on after the last required value
        context + opening,  # the third alternative is free
    ]
    assert json.loads(answers[0].tool_calls[0].arguments) == {"city": "Oslo", "days": 3}
    assert not answers[1].tool_calls and '"days": three' in answers[1].content  # as Serve answers it: as text
    assert json.loads(answers[2].tool_calls[0].arguments) == {"city": "Oslo"} and tokens == 30
    group = alternatives(step, answers, "required")
    assert [s.outcome for s in group] == [-0.9, UNSEEN, MISFIT, -0.9]  # the free one repeats the served call


def test_when_no_guided_call_writes_a_value_the_later_keys_ask_nothing():
    """Both guided rows stop at city (no string where it goes): days is never asked for, with an empty batch or not
    (the tokenizer fails on one); the rows are left as the model wrote them."""
    from policies.alternatives import resample_step

    step = trajectory(interaction(tools=(weather("city", "days"),), response=answer({"city": "Oslo"})), -0.9)
    eng = FakeEngine(["}}]</tool_call>", "}}]</tool_call>"])
    answers, tokens = resample_step(eng, step, "required", 2, max_new_tokens=64, temperature=0.9, guided=2)
    assert len(eng.prompts) == 2 and tokens == 10
    assert all(not a.tool_calls or json.loads(a.tool_calls[0].arguments) == {} for a in answers)


def test_an_alternative_our_budget_cut_off_inside_a_call_is_left_out_and_serve_s_vetting_applies():
    """Cut by the token budget inside a call: not the model's to finish, so not scored; cut after a whole call: kept.
    A Python-style positional call is mapped onto the declared parameters, as Serve maps it."""
    from policies.alternatives import resample_step

    step = trajectory(interaction(tools=(WEATHER,), response=answer({"city": "Oslo"})), -0.8)
    eng = FakeEngine([('Oslo", "days": 3, "note": "a long', "length"), ('Bergen"}}]</tool_call> and then some', "length")])
    answers, _ = resample_step(eng, step, "required", 2, max_new_tokens=16, temperature=0.9)
    assert [json.loads(a.tool_calls[0].arguments) for a in answers] == [{"city": "Bergen"}]
    text = trajectory(interaction(tools=(WEATHER,), response=ChatMessage(role="assistant", content="Hm.")), -0.8)
    (positional,), _ = resample_step(
        FakeEngine(["<tool_call>get_weather('Oslo', 3)</tool_call>"]), text, "auto", 1, max_new_tokens=16, temperature=0.9
    )
    assert json.loads(positional.tool_calls[0].arguments) == {"city": "Oslo", "days": 3}


def test_a_guided_array_or_object_is_opened_as_its_type_opens():
    """`names` (an array) is required first, `opts` (an object) second: their bracket and brace are forced too."""
    from policies.alternatives import opener, resample_step
    from policies.chat import render

    spec = ToolSpec(
        function={
            "name": "tag",
            "parameters": {
                "type": "object",
                "properties": {"names": {"type": "array"}, "opts": {"type": "object"}, "n": {"type": "integer"}},
                "required": ["names", "opts"],
            },
        }
    )
    assert [opener(spec, k) for k in ("names", "opts", "n", "other")] == ["[", "{", "", ""]
    step = trajectory(interaction(tools=(spec,), response=answer({"names": []}, name="tag")), -0.9)
    context = render(step.messages[:-1], step.tools)
    eng = FakeEngine(['"a", "b"], "x', '"k": 1}}]</tool_call>', "}}]</tool_call>"])
    (a,), _ = resample_step(eng, step, "required", 1, max_new_tokens=64, temperature=0.9, guided=1)
    head = context + '<tool_call>[{"name": "tag", "arguments": {"names": '
    assert eng.prompts == [head + "[", head + '["a", "b"], "opts": {', head + '["a", "b"], "opts": {"k": 1}']
    assert json.loads(a.tool_calls[0].arguments) == {"names": ["a", "b"], "opts": {"k": 1}}


def test_a_guided_enum_value_is_chosen_among_the_declared_values():
    """`unit` (a string enum) is required after `city`: its value is chosen by constrained decoding among the declared
    values, each after the forced quote, as `PolicyGenerator.call_arguments` chooses one; no text is generated for it.
    An enum of numbers under a string type cannot follow the quote, nor can decoding pick 1 among 1 and 10: the model
    writes those values. Non-ASCII stays as the model writes it."""
    from policies.alternatives import enum_options, resample_step
    from policies.chat import enum_texts, render

    spec = tool(
        "get_weather",
        {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["C", "F"]}, "n": {"type": "string", "enum": [1, 2]}},
        ["city", "unit"],
    )
    assert enum_options(spec, "unit") == ['C"', 'F"'] and enum_options(spec, "n") == [] and enum_options(spec, "city") == []
    assert enum_texts([1, 10]) == [] and enum_texts([1, 2, True]) == ["1", "2", "true"] and enum_texts(["°C"], '"') == ['°C"']
    step = trajectory(interaction(tools=(spec,), response=answer({"city": "Oslo"})), -0.9)
    context = render(step.messages[:-1], step.tools)
    eng = FakeEngine(['Oslo", "x', "}}]</tool_call>"])
    (a,), tokens = resample_step(eng, step, "required", 1, max_new_tokens=64, temperature=0.9, guided=1)
    opening = '<tool_call>[{"name": "get_weather", "arguments": {"city": "'
    assert eng.chose == [['C"', 'F"']]  # FakeEngine picks the last option
    assert eng.prompts == [context + opening, context + opening + 'Oslo", "unit": "F"']
    assert json.loads(a.tool_calls[0].arguments) == {"city": "Oslo", "unit": "F"} and tokens == 11  # 5 per generation, 1 chosen


def test_an_alternative_that_is_not_a_call_follows_the_request_s_response_format_as_serve_s_answer_did():
    from policies.alternatives import resample_step

    fmt = {"type": "json_object"}
    text = trajectory(interaction(tools=(WEATHER,), response=ChatMessage(role="assistant", content='{"a": 1}')), -0.8)
    eng = FakeEngine(['{"a": 2}'])
    (a,), _ = resample_step(eng, text, "auto", 1, max_new_tokens=64, temperature=0.9, response_format=fmt)
    assert a.content == '{"a": 2}' and "%json" in eng.grammars[0] and "<tool_call>" in eng.grammars[0]
    called = trajectory(interaction(tools=(WEATHER,)), -0.8)  # the served step called: its alternatives are calls
    eng = FakeEngine(['Oslo"}}]</tool_call>'])
    resample_step(eng, called, "auto", 1, max_new_tokens=64, temperature=0.9, response_format=fmt)
    assert eng.grammars == [None]
