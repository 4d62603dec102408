"""Tool calls a client can trust (the serving edge): a call to an undeclared function, arguments that are not a JSON
object, or an invented `_positional` argument never reach a client as `finish_reason: tool_calls`; the model's text
is answered as text instead (its tokens unchanged, for the learner). A call cut off by the token limit finishes
with `length`, as the reference's does; one that closed before the limit cut the text after it, `tool_calls`."""

import json

import pytest

from actors.events import RetrieveReply, ToolSpec
from policies.engines.generation import Generation
from serve.interactions import Turn
from serve.schemas import ChatRequest

TOOLS = [
    ToolSpec.model_validate(
        {
            "type": "function",
            "function": {
                "name": "get-weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}}},
            },
        }
    )
]


def _answer(text, finish="stop", forced="", parallel=None):
    req = ChatRequest.model_validate(
        {
            "messages": [{"role": "user", "content": "weather?"}],
            "tools": [t.model_dump() for t in TOOLS],
            "parallel_tool_calls": parallel,
        }
    )
    turn = Turn(req=req, messages=[], tools=TOOLS, memory=RetrieveReply(), prompt="p", forced=forced)
    gen = Generation(text, 3, 9, finish)
    msg = turn.answer(gen)
    return msg, turn.finish(msg, gen)


def test_a_declared_call_with_json_arguments_goes_out_as_a_call():
    msg, finish = _answer('<tool_call>[{"name": "get-weather", "arguments": {"city": "Paris"}}]</tool_call>')
    assert finish == "tool_calls" and [(c.name, json.loads(c.arguments)) for c in msg.tool_calls] == [
        ("get-weather", {"city": "Paris"})
    ]


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>[{"name": "delete_everything", "arguments": {}}]</tool_call>',  # not declared
        '<tool_call>[{"name": "get-weather", "arguments": "Paris"}]</tool_call>',  # not a JSON object
        "<tool_call>[{oops</tool_call>",  # malformed: parsed as invalid_call
        "get-weather('Paris', 'C', 'extra')",  # more positional arguments than declared parameters
    ],
)
def test_anything_a_client_cannot_run_is_answered_as_the_models_text(text):
    msg, finish = _answer(text)
    assert msg.tool_calls == [] and finish == "stop" and msg.content == text


def test_positional_arguments_take_the_declared_parameter_names_in_order():
    msg, finish = _answer('<tool_call>[{"name": "get-weather", "arguments": {"_positional": ["C"], "city": "Oslo"}}]</tool_call>')
    assert json.loads(msg.tool_calls[0].arguments) == {"unit": "C", "city": "Oslo"} and finish == "tool_calls"
    assert "_positional" not in msg.tool_calls[0].arguments


def test_a_call_cut_off_by_the_token_limit_finishes_with_length():
    forced = '<tool_call>[{"name": "get-weather", "arguments": '
    msg, finish = _answer('{"city": "Par', finish="length", forced=forced)
    assert msg.tool_calls[0].name == "get-weather" and finish == "length"
    msg, finish = _answer('{"city": "Paris"}}]</tool_call>', forced=forced)
    assert finish == "tool_calls" and json.loads(msg.tool_calls[0].arguments) == {"city": "Paris"}
    # the call closed, then the limit cut the prose after it: the call was made whole, so `tool_calls`, as its arguments
    # parse or not (a non-strict forced call goes out as written)
    for args in ('{"city": "Paris"}', '{"city": "Paris}'):
        msg, finish = _answer(args + "}]</tool_call>\n\nI will focus on", finish="length", forced=forced)
        assert finish == "tool_calls" and msg.tool_calls[0].arguments == args


def test_an_unforced_call_cut_off_by_the_token_limit_is_a_call_with_its_partial_arguments():
    msg, finish = _answer('Checking. <tool_call>[{"name": "get-weather", "arguments": {"city": "Par', finish="length")
    assert [(c.name, c.arguments) for c in msg.tool_calls] == [("get-weather", '{"city": "Par')] and finish == "length"
    assert msg.content == "Checking."  # its markup is no text
    # an undeclared name stays the model's text
    msg, finish = _answer('<tool_call>[{"name": "rm", "arguments": {"p', finish="length")
    assert msg.tool_calls == [] and msg.content == '<tool_call>[{"name": "rm", "arguments": {"p' and finish == "length"


def test_a_named_tool_choice_answers_with_calls_of_that_function_alone():
    both = '{"city": "A"}}, {"name": "get-weather", "arguments": {"city": "B"}}, {"name": "delete", "arguments": {}}]</tool_call>'
    tools = [*TOOLS, ToolSpec.model_validate({"type": "function", "function": {"name": "delete", "parameters": {}}})]
    req = ChatRequest.model_validate(
        {
            "messages": [{"role": "user", "content": "weather?"}],
            "tools": [t.model_dump() for t in tools],
            "tool_choice": {"type": "function", "function": {"name": "get-weather"}},
        }
    )
    forced = '<tool_call>[{"name": "get-weather", "arguments": '
    turn = Turn(req=req, messages=[], tools=tools, memory=RetrieveReply(), prompt="p", forced=forced)
    msg = turn.answer(Generation(both, 3, 9, "stop"))
    assert [c.name for c in msg.tool_calls] == ["get-weather", "get-weather"]
    req.tool_choice = "required"  # any declared function may follow the first
    assert [c.name for c in turn.answer(Generation(both, 3, 9, "stop")).tool_calls] == ["get-weather", "get-weather", "delete"]


def test_no_parallel_calls_keeps_the_first_and_a_text_answer_cut_off_finishes_with_length():
    two = (
        '<tool_call>[{"name": "get-weather", "arguments": {"city": "A"}}, '
        '{"name": "get-weather", "arguments": {"city": "B"}}]</tool_call>'
    )
    assert len(_answer(two)[0].tool_calls) == 2 and len(_answer(two, parallel=False)[0].tool_calls) == 1
    msg, finish = _answer("It is sunny in", finish="length")
    assert msg.content == "It is sunny in" and finish == "length"


def test_the_user_of_an_interaction_is_its_user_field_else_its_connection():
    from actors.events import ChatMessage

    def user_of(peer, user=None, key="k1", salt=b"s" * 32):
        body = {"messages": [{"role": "user", "content": "hi"}], **({"user": user} if user else {})}
        turn = Turn(req=ChatRequest.model_validate(body), messages=[], tools=[], memory=RetrieveReply(), prompt="p", peer=peer)
        return turn.interaction(ChatMessage(role="assistant", content="hello"), "w-1", False, "r0", key, salt).user_hash

    assert user_of("10.0.0.1") != user_of("10.0.0.2")  # two anonymous clients of one API key
    assert user_of("10.0.0.1", "alice") == user_of("10.0.0.2", "alice")  # `user` names the user wherever they are
    assert user_of("10.0.0.1", "alice") != user_of("10.0.0.1", "alice", key="k2")
    # keyed by the deployment's salt: an address cannot be found again from its hash without it
    assert user_of("10.0.0.1") != user_of("10.0.0.1", salt=b"t" * 32)


def test_the_user_salt_is_made_once_and_shared(tmp_path):
    import stat

    from serve.interactions import user_salt

    first = user_salt(tmp_path)
    assert len(first) == 32 and user_salt(tmp_path) == first  # a second replica, or a restart, reads the same
    path = tmp_path / "secrets" / "user_salt"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and [p.name for p in path.parent.iterdir()] == ["user_salt"]
    assert user_salt(tmp_path / "other") != first  # another deployment, another salt
    for bad in ("short", "z" * 64):
        path.write_text(bad)
        with pytest.raises(ValueError, match="no usable salt"):
            user_salt(tmp_path)


def test_every_replica_gets_the_deployments_salt_from_where_the_app_is_built(tmp_path):
    from config.settings import load_settings
    from serve.app import build_app
    from serve.interactions import user_salt

    s = load_settings(None)
    s.state_dir = str(tmp_path)
    args = build_app(s, "k")._bound_deployment.init_args  # what Serve hands each replica, on whichever host
    assert args[1:3] == ("k", user_salt(tmp_path).hex())
