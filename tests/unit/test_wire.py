"""The HTTP edge: every malformed chat request is a 400 with the reference's error object, never an exception (a
500); what the reference accepts (explicit nulls, dashes in tool names, a client's default max_tokens) is accepted,
and what this deployment cannot do is refused by name."""

import json

import pytest

from serve.wire import BadRequest, check_json, parse_chat

CAP = 256
USER = [{"role": "user", "content": "hi"}]


def _tool(parameters, name="ls"):
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


def _status(body) -> int:
    try:
        parse_chat(body, CAP)
    except BadRequest as exc:
        err = json.loads(exc.response().body)["error"]
        assert exc.message and err["message"] == exc.message and err["type"] == "invalid_request_error"
        assert set(err) == {"message", "type", "param", "code"} and not isinstance(err["code"], int)
        return exc.status
    return 200


def _deep(n):
    return json.loads("[" * n + "]" * n)


@pytest.mark.parametrize(
    "body,status",
    [
        ({"messages": USER}, 200),
        (
            {
                "messages": USER,
                "tools": [_tool({"type": "object", "properties": {"p": {"type": "string"}}, "required": ["p"]})],
                "tool_choice": {"type": "function", "function": {"name": "ls"}},
            },
            200,
        ),
        ({"messages": USER, "tools": [_tool({"type": "object", "properties": {"p": {"type": ["string", "null"]}}})]}, 200),
        ({"messages": USER, "max_tokens": CAP}, 200),
        # the cases a user hit, and their neighbours
        ({"messages": USER, "tools": [_tool({"type": "object", "properties": "bad"})]}, 400),
        ({"messages": USER, "tools": [_tool({"type": "object", "properties": {"path": "string"}})]}, 400),
        ({"messages": USER, "tools": [_tool({"type": "object", "properties": {}, "required": 5})]}, 400),
        ({"messages": USER, "tools": [_tool({"type": "object", "properties": {}, "required": [5]})]}, 400),
        ({"messages": USER, "tools": [_tool({"type": "object", "properties": {}, "required": ["nope"]})]}, 400),
        ({"messages": USER, "tools": [_tool({"type": "object", "properties": [{"path": {"type": "string"}}]})]}, 400),
        ({"messages": USER, "tools": [_tool({"type": "object", "properties": {"p": {"type": 7}}})]}, 400),
        ({"messages": USER, "tools": [_tool({"type": "array"})]}, 400),
        ({"messages": USER, "tools": [_tool("bad")]}, 400),
        ({"messages": USER, "tools": [{"type": "function", "function": {"name": "a b"}}]}, 400),
        ({"messages": USER, "tools": [_tool({})], "tool_choice": {"type": "function", "function": "ls"}}, 400),
        ({"messages": USER, "tools": [_tool({})], "tool_choice": {"type": "function", "function": {"name": "rm"}}}, 400),
        ({"messages": USER, "tools": [_tool({})], "tool_choice": "sometimes"}, 400),
        ({"messages": USER, "tools": [_tool({})], "tool_choice": 3}, 400),
        ({"messages": [{"role": "user", "content": "a\ud800b"}]}, 400),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}]}, 400),
        ({"messages": USER, "user": "\ud83d"}, 400),
        ({"messages": USER, "max_tokens": 1_000_000_000}, 200),  # clamped to the cap, as a client's default 4096 is
        ({"messages": USER, "max_completion_tokens": CAP + 1}, 200),
        ({"messages": USER, "max_tokens": 0}, 400),
        ({"messages": USER, "max_tokens": "many"}, 400),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400),
        ({"messages": [{"role": "robot", "content": "x"}]}, 400),
        ({"messages": [{"role": "system", "content": "x"}]}, 200),  # the reference answers system-only conversations
        # explicit nulls mean the default; dashes are legal in tool names (MCP tools use them)
        ({"messages": USER, "stream": None, "temperature": None, "top_p": None, "n": None, "stop": None}, 200),
        ({"messages": USER, "tools": [_tool({}, name="get-weather")]}, 200),
        (
            {
                "messages": USER,
                "stop": ["4", "\n\n"],
                "parallel_tool_calls": False,
                "stream_options": {"include_usage": True},
                "response_format": {"type": "text"},
            },
            200,
        ),
        # refused by name, never ignored
        ({"messages": USER, "n": 2}, 400),
        ({"messages": USER, "seed": 7}, 400),
        ({"messages": USER, "response_format": {"type": "json_object"}}, 200),  # structured output: decoded under its grammar
        ({"messages": USER, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}, 200),
        (
            {"messages": USER, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 3}}}},
            400,
        ),
        ({"messages": USER, "response_format": {"type": "yaml"}}, 400),
        ({"messages": USER, "logprobs": True}, 400),
        ({"messages": USER, "stop": ["a", "b", "c", "d", "e"]}, 400),
        ({"messages": USER, "extra": _deep(100)}, 400),
        ([1, 2], 400),
        ("text", 400),
        (None, 400),
    ],
)
def test_bad_chat_requests_are_4xx(body, status):
    assert _status(body) == status


def test_a_budget_beyond_the_cap_is_clamped_and_refusals_name_the_parameter():
    req, *_ = parse_chat({"messages": USER, "max_tokens": 4096}, CAP)
    assert req.max_tokens == CAP and req.temperature == 0.7 and req.n == 1 and req.stream is False
    parse_chat({"messages": USER, "presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {}}, CAP)  # no change: taken
    for body, param in [
        ({"messages": USER, "n": 3}, "n"),
        ({"messages": USER, "seed": 1}, "seed"),
        ({"messages": USER, "presence_penalty": 0.5}, "presence_penalty"),
        ({"messages": USER, "frequency_penalty": -1}, "frequency_penalty"),
        ({"messages": USER, "logit_bias": {"50256": -100}}, "logit_bias"),
        ({"messages": USER, "max_tokens": "x"}, "max_tokens"),
        ({"messages": "x"}, "messages"),
    ]:
        with pytest.raises(BadRequest) as exc:
            parse_chat(body, CAP)
        assert exc.value.param == param, (body, exc.value.param)


def test_stop_sequences_cut_text_and_streams_never_send_their_start():
    from serve.wire import StopStream, cut_at_stop

    assert cut_at_stop("1, 2, 3, 4, 5", ["4"]) == ("1, 2, 3, ", True) and cut_at_stop("abc", ["x"]) == ("abc", False)
    st = StopStream(["END", "\n\n"])
    sent = [st.feed(p) for p in ("Hello E", "N", "D of story", " more")]
    assert "".join(sent) == "Hello " and st.stopped and st.rest() == ""
    st = StopStream(["END"])
    assert "".join(st.feed(p) for p in ("no stop he", "re, E")) + st.rest() == "no stop here, E"


def test_check_json_depth_and_unicode():
    assert check_json({"a": [1, {"b": "ok"}]}) is None
    assert check_json(_deep(64)) is None and "deeper than 64" in check_json(_deep(65))
    assert "not valid Unicode" in check_json({"k": ["x", "a\ud800b"]})
    assert "key" in check_json({"\ud800": 1})
    with pytest.raises(RecursionError):  # what json.loads does with 1,000 levels: the edge turns it into a 400
        json.loads("[" * 100_000 + "]" * 100_000)


def test_outbox_takes_concurrent_writers_and_finds_pending_interactions_by_id(tmp_path):
    """The answers of one batch finish together: their records are written from many threads at once, and feedback
    finds each one in the outbox by its interaction id while it is pending."""
    import threading

    from actors.events import ChatMessage, Interaction
    from serve.interactions import interaction_event_id
    from serve.outbox import Outbox

    log = Outbox(tmp_path / "outbox.db")
    evs = [
        Interaction(
            event_id=interaction_event_id(f"i{i}"),
            interaction_id=f"i{i}",
            user_hash="u",
            messages=[ChatMessage(role="user", content="hi")],
            response=ChatMessage(role="assistant", content=str(i)),
        )
        for i in range(64)
    ]
    errors = []

    def put(chunk):
        try:
            for e in chunk:
                log.put(e)
                assert log.get(interaction_event_id(e.interaction_id)).response.content == e.response.content
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=put, args=(evs[i::8],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert log.size() == 64 and log.get(interaction_event_id("i64")) is None
    assert not errors and all(log.get(interaction_event_id(f"i{i}")) for i in range(64))
