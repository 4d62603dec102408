"""The serving edge answers as the reference does where clients rely on it: a forced call is always a call, deprecated
function-calling fields are refused by name, `top_p: 0` is greedy, the key's scheme is case-insensitive, the event
stream is unbuffered, a bare Python-style call is never streamed as text and then sent as a call too,
`safety_identifier` names the user, `stop` ends generation, up to 128 tools are taken, and a client set up for
another of the reference's APIs is told which one this is."""

import asyncio
import json
from types import SimpleNamespace

import pytest

from actors.events import ChatMessage, RetrieveReply, ToolSpec
from policies.engines.generation import Generation
from serve.interactions import Turn
from serve.schemas import ChatRequest
from serve.streaming import stream_chat
from serve.wire import BadRequest, parse_chat

USER = [{"role": "user", "content": "weather?"}]
TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}
FORCED = '<tool_call>[{"name": "get_weather", "arguments": '


class _Engine:
    version = "w-000001"

    def __init__(self, pieces):
        self.pieces = pieces

    def generate(self, prompts, max_new, temperature, top_p, stream_cb=None, stops=(), grammar=None):
        self.stops, self.grammar = stops, grammar
        for piece in self.pieces:
            if stream_cb:
                stream_cb(piece)
        return [Generation("".join(self.pieces), 3, len(self.pieces), "stop", self.version)]


class _Server:
    def __init__(self):
        self.s = SimpleNamespace(model=SimpleNamespace(name="m"))
        self.log = SimpleNamespace(exception=lambda *a, **k: None)

    async def _in_pool(self, fn, *args):
        return await asyncio.to_thread(fn, *args)

    async def _record(self, *a, **k):
        pass


def _turn(pieces, forced="", **body):
    req = ChatRequest.model_validate({"messages": USER, "tools": [TOOL], "stream": True, **body})
    tools = [ToolSpec.model_validate(TOOL)]
    return Turn(req=req, messages=[], tools=tools, memory=RetrieveReply(), prompt="p", forced=forced, engine=_Engine(pieces))


def _stream(pieces, forced="", fmt=None):
    """(the content of each chunk between the first and the last, the calls, the finish reason)."""
    turn = _turn(pieces, forced, **({"response_format": fmt} if fmt else {}))

    async def go():
        frames = [json.loads(f[6:]) for f in [f async for f in stream_chat(_Server(), turn)] if "[DONE]" not in f]
        assert turn.engine.grammar == turn.grammar
        return frames

    frames = asyncio.run(go())
    deltas = [f["choices"][0]["delta"] for f in frames]
    calls = [c for d in deltas for c in d.get("tool_calls", [])]
    return [d.get("content") for d in deltas[1:-1]], calls, frames[-1]["choices"][0]["finish_reason"]


def _error(body) -> tuple[int, str | None]:
    try:
        parse_chat(body, 256)
    except BadRequest as exc:
        return exc.status, exc.param
    return 200, None


@pytest.mark.parametrize("text", ['{"city": Paris}}]</tool_call>', '"Paris", "unit": C}]</tool_call>'])
def test_a_forced_call_with_malformed_arguments_is_still_the_call_with_its_raw_arguments(text):
    turn = _turn([text], forced=FORCED)
    gen = Generation(text, 3, 9, "stop")
    msg = turn.answer(gen)
    assert [c.name for c in msg.tool_calls] == ["get_weather"] and turn.finish(msg, gen) == "tool_calls"
    assert "<tool_call>" not in (msg.content or "") and "</tool_call>" not in msg.tool_calls[0].arguments
    assert msg.tool_calls[0].arguments.startswith(text[:4])
    texts, calls, finish = _stream([text], forced=FORCED)  # streamed: the same call, no markup as content
    assert [c["function"]["name"] for c in calls] == ["get_weather"] and finish == "tool_calls"
    assert not any("<tool_call>" in (t or "") for t in texts)


def test_the_raw_arguments_of_a_forced_call_lose_the_markup_that_closes_the_call():
    msg = _turn([]).answer(Generation('{"city": Paris}}]</tool_call>', 3, 9, "stop"))  # not forced: the model's text
    assert msg.tool_calls == [] and msg.content.startswith("{")
    turn = _turn([], forced=FORCED)
    assert turn.answer(Generation('{"city": Paris}}]</tool_call>', 3, 9, "stop")).tool_calls[0].arguments == '{"city": Paris}'
    # the arguments closed, the call's own brace left out: the arguments are whole, and go out as the JSON they are
    closed = turn.answer(Generation('{"city": "Paris"}]</tool_call>', 3, 9, "stop"))
    assert closed.tool_calls[0].arguments == '{"city": "Paris"}'


def test_a_forced_call_that_closed_and_ran_on_to_the_token_limit_keeps_only_its_own_arguments():
    text = '{"city": "Paris}}]</tool_call>\n\nI will focus on the guidelines'  # the limit cut the prose after the call
    turn = _turn([], forced=FORCED, max_tokens=16)
    msg = turn.answer(Generation(text, 3, 16, "length"))
    assert [(c.name, c.arguments) for c in msg.tool_calls] == [("get_weather", '{"city": "Paris}')]
    assert "I will focus" not in msg.tool_calls[0].arguments
    cut = turn.answer(Generation('{"city": "Par', 3, 16, "length"))  # the limit cut the call itself: all of it is arguments
    assert [(c.name, c.arguments) for c in cut.tool_calls] == [("get_weather", '{"city": "Par')]


@pytest.mark.parametrize(
    "body,param",
    [
        ({"messages": USER, "functions": [{"name": "f", "parameters": {}}]}, "functions"),
        ({"messages": USER, "function_call": "auto"}, "function_call"),
        ({"messages": [*USER, {"role": "function", "name": "f", "content": "{}"}]}, "messages.1.role"),
        ({"messages": [{"role": "assistant", "content": None, "function_call": {"name": "f"}}]}, "messages.0.function_call"),
        ({"messages": USER, "tool_choice": "required"}, "tool_choice"),
        ({"messages": USER, "tools": [], "tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
    ],
)
def test_deprecated_function_calling_and_a_forced_call_without_tools_are_refused_by_name(body, param):
    assert _error(body) == (400, param)


def test_tool_choice_auto_or_none_without_tools_and_null_legacy_fields_are_accepted():
    for extra in ({"tool_choice": "auto"}, {"tool_choice": "none"}, {"functions": None, "function_call": None}):
        assert _error({"messages": USER, **extra}) == (200, None)


def test_legacy_refusals_say_what_to_use_instead():
    with pytest.raises(BadRequest, match="use tools"):
        parse_chat({"messages": USER, "functions": []}, 256)
    with pytest.raises(BadRequest, match='role "tool"'):
        parse_chat({"messages": [{"role": "function", "name": "f", "content": "{}"}]}, 256)


def test_top_p_zero_is_accepted_as_greedy():
    req = parse_chat({"messages": USER, "top_p": 0, "temperature": 1.0}, 256)[0]
    assert (req.temperature, req.top_p) == (0.0, 1.0)
    assert parse_chat({"messages": USER, "top_p": 0.5}, 256)[0].top_p == 0.5
    assert _error({"messages": USER, "top_p": -0.1})[0] == 400


@pytest.mark.parametrize(
    "header,ok", [("Bearer k1", True), ("bearer k1", True), ("BEARER  k1", True), ("Basic k1", False), ("k1", False)]
)
def test_the_authorization_scheme_is_case_insensitive(header, ok):
    from serve.net import authorized

    assert authorized(SimpleNamespace(headers={"authorization": header}), "k1") is ok


def test_the_event_stream_tells_proxies_not_to_buffer_it():
    from serve.streaming import sse_response

    headers = sse_response(_Server(), _turn([])).headers
    assert headers["cache-control"] == "no-cache" and headers["x-accel-buffering"] == "no"


def test_a_bare_python_call_streamed_with_tools_goes_out_only_as_the_call():
    texts, calls, finish = _stream(["get_", "weather(city=", '"Paris")'])
    assert not any(texts) and finish == "tool_calls"
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ]


@pytest.mark.parametrize("pieces", [["get", " is ", "a verb", " " * 20], ["get_weather(city=", "x) is ", "code", " " * 20]])
def test_text_that_only_began_like_a_call_streams_once_it_cannot_be_one(pieces):
    texts, calls, finish = _stream(pieces)
    assert calls == [] and finish == "stop" and texts[-1] is None  # all of it streamed before the last frames
    assert "".join(t or "" for t in texts).strip() == "".join(pieces).strip()


def test_safety_identifier_names_the_user_when_user_is_absent():
    def user_hash(peer, **who):
        turn = Turn(
            req=ChatRequest.model_validate({"messages": USER, **who}),
            messages=[],
            tools=[],
            memory=RetrieveReply(),
            prompt="p",
            peer=peer,
        )
        return turn.interaction(ChatMessage(role="assistant", content="hi"), "w-1", False, "r0", "k", b"s" * 32).user_hash

    assert user_hash("10.0.0.1", safety_identifier="alice") == user_hash("10.0.0.2", safety_identifier="alice")
    assert user_hash("10.0.0.1", safety_identifier="alice") == user_hash("10.0.0.2", user="alice")
    assert user_hash("10.0.0.1", user="bob", safety_identifier="alice") == user_hash("10.0.0.2", user="bob")


def test_the_requests_stop_strings_reach_the_engine_so_generation_ends_there():
    turn = _turn(["It is sunny.\nObservation: x"], stop=["\nObservation:"])

    async def go():
        return [f async for f in stream_chat(_Server(), turn)]

    frames = asyncio.run(go())
    assert list(turn.engine.stops) == ["\nObservation:"]  # the engine ends the row there, not the token budget
    assert "Observation" not in "".join(frames) and turn.stopped


def test_a_client_set_up_for_another_api_is_told_which_one_this_is():
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from serve.wire import answer_errors

    app = FastAPI()
    answer_errors(app)
    client = TestClient(app)
    r = client.post("/v1/completions", json={"prompt": "hi"})
    assert r.status_code == 404 and "POST /v1/chat/completions" in r.json()["error"]["message"]
    assert client.get("/v1/nothing").json()["error"]["message"] == "Not Found"  # any other path: as before


def test_up_to_128_tools_as_the_reference_takes():
    tools = [{"type": "function", "function": {"name": f"f{i}", "parameters": {"type": "object"}}} for i in range(129)]
    assert _error({"messages": USER, "tools": tools[:128]}) == (200, None)
    assert _error({"messages": USER, "tools": tools})[0] == 400


def test_no_token_is_never_a_key():
    from serve.net import authorized

    assert not authorized(SimpleNamespace(headers={"authorization": "Bearer "}), "")
    assert not authorized(SimpleNamespace(headers={"authorization": "bearer"}), "")


def test_the_other_apis_paths_below_their_roots_are_named_too():
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from serve.wire import answer_errors

    app = FastAPI()
    answer_errors(app)
    r = TestClient(app).post("/v1/audio/speech", json={})
    assert r.status_code == 404 and "POST /v1/chat/completions" in r.json()["error"]["message"]


def test_a_response_format_reaches_the_engine_as_a_grammar_that_admits_a_call_only_where_one_may_be_made():
    fmt = {"type": "json_object"}
    turn = _turn(['{"a": 1}'], response_format=fmt)
    assert turn.generate()[0].text == '{"a": 1}' and "%json" in turn.engine.grammar and "<tool_call>" in turn.engine.grammar
    assert _turn([], forced=FORCED, response_format=fmt).grammar is None  # a forced call: the answer is a call
    assert _turn([]).grammar is None
    assert '"maxItems": 1' in _turn([], response_format=fmt, parallel_tool_calls=False).grammar  # one call at most
    assert turn.interaction(turn.answer(turn.generate()[0]), "w-1", False, "r", "k", b"s" * 32).response_format == fmt
    texts, calls, finish = _stream(['{"a": ', "1}"], fmt=fmt)  # streamed: the same grammar
    assert "".join(texts) == '{"a": 1}' and not calls and finish == "stop"
