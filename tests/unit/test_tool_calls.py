import json

import pytest

from actors.events import ChatMessage, ToolCall, ToolSpec
from envs.bfcl import BfclEnvironment
from envs.tool_calls import CallError, parse_json_call, parse_python_call
from policies.chat import parse_assistant


def test_python_call_is_parsed_without_eval():
    p = parse_python_call("mv(source='a.pdf', destination='temp')")
    assert p.name == "mv" and p.kwargs == {"source": "a.pdf", "destination": "temp"}
    assert parse_python_call("sort('f.txt')").args == ("f.txt",)


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os').system('echo hi')",
        "os.system('x')",
        "f(x=open('/etc/passwd'))",
        "f(**{'a': 1})",
        "f(x=1+__import__('os').getpid())",
        "(lambda: 1)()",
    ],
)
def test_hostile_python_calls_are_refused(text):
    with pytest.raises(CallError):
        parse_python_call(text)


def test_huge_arguments_are_refused():
    with pytest.raises(CallError):
        parse_json_call("cd", json.dumps({"folder": "x" * 10_000_000}))


def test_parse_assistant_json_and_malformed():
    m = parse_assistant('<tool_call>[{"name": "cd", "arguments": {"folder": "document"}}]</tool_call>')
    assert [c.name for c in m.tool_calls] == ["cd"] and json.loads(m.tool_calls[0].arguments) == {"folder": "document"}
    bad = parse_assistant('<tool_call>[{"nam": 1}]</tool_call>')
    assert bad.tool_calls[0].name == "invalid_call"
    plain = parse_assistant("The capital of France is Paris.")
    assert plain.tool_calls == [] and plain.content.startswith("The capital")


def _episode():
    env = BfclEnvironment(["base"], max_turns=1, max_steps_per_turn=5)
    ep = env.episode("multi_turn_base_0")
    ep.next_user_message()
    return ep


@pytest.mark.parametrize(
    "name,args",
    [
        ("unknown_fn", "{}"),
        ("cd", '{"folder": "document", "extra": 1}'),
        ("cd", '{"folder": 5}'),
        ("cd", '{"folder": "../../../../etc"}'),
        ("__import__", '{"name": "os"}'),
        ("_load_scenario", "{}"),
        ("cd", "not json"),
        ("cd", json.dumps({"folder": "x" * 10_000_000})),
    ],
)
def test_invalid_or_hostile_calls_become_error_observations(name, args):
    ep = _episode()
    before = json.dumps(
        ep.model.instances["GorillaFileSystem"].root._to_dict()
        if hasattr(ep.model.instances["GorillaFileSystem"].root, "_to_dict")
        else str(vars(ep.model.instances["GorillaFileSystem"]))
    )
    r = ep.step(ChatMessage(role="assistant", tool_calls=[ToolCall(id="c1", name=name, arguments=args)]))
    assert r.signal < 0
    assert len(r.observations) == 1 and r.observations[0].role == "tool"
    assert "rror" in r.observations[0].content or "No such" in r.observations[0].content
    after = json.dumps(
        ep.model.instances["GorillaFileSystem"].root._to_dict()
        if hasattr(ep.model.instances["GorillaFileSystem"].root, "_to_dict")
        else str(vars(ep.model.instances["GorillaFileSystem"]))
    )
    if name != "cd" or "etc" not in args:
        assert before == after


def test_tool_choice_forces_a_call_or_a_named_function():
    from actors.events import ToolSpec
    from policies.chat import CALL_PREFIX, parse_assistant, tool_choice_prefix

    tools = [ToolSpec(function={"name": "mkdir", "parameters": {"type": "object", "properties": {}}})]
    assert tool_choice_prefix(None, tools) == tool_choice_prefix("auto", tools) == tool_choice_prefix("none", tools) == ""
    assert tool_choice_prefix("required", tools) == CALL_PREFIX
    named = tool_choice_prefix({"type": "function", "function": {"name": "mkdir"}}, tools)
    msg = parse_assistant(named + '"dir_name": "x"}}]</tool_call>')
    assert [(c.name, c.arguments) for c in msg.tool_calls] == [("mkdir", '{"dir_name": "x"}')]
    for bad in [{"type": "function", "function": {"name": "rm"}}, "sometimes"]:
        with pytest.raises(ValueError):
            tool_choice_prefix(bad, tools)


def test_forced_named_call_opens_the_first_required_argument_and_bare_keys_are_accepted():
    from actors.events import ToolSpec
    from policies.chat import parse_assistant, tool_choice_prefix

    tools = [
        ToolSpec(
            function={
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            }
        )
    ]
    p = tool_choice_prefix({"type": "function", "function": {"name": "get_weather"}}, tools)
    assert p.endswith('{"city": "')
    assert parse_assistant(p + 'Paris"}}]</tool_call>').tool_calls[0].arguments == '{"city": "Paris"}'
    bare = parse_assistant('<tool_call>[{"name": "get_weather", "arguments": {city: "Paris"}}]</tool_call>')
    assert [(c.name, c.arguments) for c in bare.tool_calls] == [("get_weather", '{"city": "Paris"}')]
    keeps = parse_assistant('<tool_call>[{"name": "note", "arguments": {"text": "a, b: c"}}]</tool_call>')
    assert keeps.tool_calls[0].arguments == '{"text": "a, b: c"}'  # valid JSON is never rewritten


@pytest.mark.parametrize(
    "tail",
    [
        'Paris"}}]\n</tool_call>\nmore text',
        'Paris"}}</tool_call>\n\nThat is all.',
        'Paris"}}](https://example.com/paris)',
        'Paris"}}>Paris weather',
    ],
)
def test_a_valid_call_followed_by_junk_or_missing_its_bracket_still_parses(tail):
    from policies.chat import parse_assistant

    msg = parse_assistant('<tool_call>[{"name": "get_weather", "arguments": {"city": "' + tail)
    assert [(c.name, c.arguments) for c in msg.tool_calls][:1] == [("get_weather", '{"city": "Paris"}')]


class _Chooser:
    """Records what the constrained choice was asked and picks the second option."""

    def __init__(self):
        self.asked = []

    def choose(self, prompt, options, temperature=0.0):
        self.asked.append((prompt, options, temperature))
        return options[1]


def test_forced_prefix_chooses_a_declared_name_only_when_given_an_engine():
    from actors.events import ToolSpec
    from policies.chat import CALL_PREFIX
    from policies.rollout import forced_prefix

    tools = [
        ToolSpec(function={"name": "ls", "parameters": {"type": "object", "properties": {}}}),
        ToolSpec(
            function={
                "name": "cd",
                "parameters": {"type": "object", "required": ["folder"], "properties": {"folder": {"type": "string"}}},
            }
        ),
    ]
    assert forced_prefix(tools) == CALL_PREFIX  # no engine: the name is left to whatever writes next
    eng = _Chooser()
    got = forced_prefix(tools, eng, "PROMPT", 0.7)
    assert got == '<tool_call>[{"name": "cd", "arguments": {"folder": "'
    assert eng.asked == [("PROMPT" + CALL_PREFIX, ['ls"', 'cd"'], 0.7)]


def test_a_forced_call_cut_off_by_the_token_limit_keeps_its_name():
    from policies.chat import call_opening, parse_forced

    spec = ToolSpec(
        type="function",
        function={
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    )
    forced = call_opening(spec)
    cut = parse_forced(forced, "Paris, France, where the weather")
    assert [(c.name, c.arguments) for c in cut.tool_calls] == [("get_weather", '{"city": "Paris, France, where the weather')]
    whole = parse_forced(forced, 'Paris"}}]</tool_call>')
    assert [(c.name, json.loads(c.arguments)) for c in whole.tool_calls] == [("get_weather", {"city": "Paris"})]
    free = parse_forced("", '<tool_call>[{"name": "get_weather", "arguments": {"city": "Par')  # nothing forced
    assert [c.name for c in free.tool_calls] == ["invalid_call"]
