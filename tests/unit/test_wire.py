"""The HTTP edge: every malformed chat request is a 4xx with a message, never an exception (a 500)."""
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
        assert exc.message and json.loads(exc.response().body)["error"]["message"] == exc.message
        return exc.status
    return 200


def _deep(n):
    return json.loads("[" * n + "]" * n)


@pytest.mark.parametrize("body,status", [
    ({"messages": USER}, 200),
    ({"messages": USER, "tools": [_tool({"type": "object", "properties": {"p": {"type": "string"}}, "required": ["p"]})],
      "tool_choice": {"type": "function", "function": {"name": "ls"}}}, 200),
    ({"messages": USER, "tools": [_tool({"type": "object", "properties": {"p": {"type": ["string", "null"]}}})]}, 200),
    ({"messages": USER, "max_tokens": CAP}, 200),
    # the cases a user hit, and their neighbours
    ({"messages": USER, "tools": [_tool({"type": "object", "properties": "bad"})]}, 422),
    ({"messages": USER, "tools": [_tool({"type": "object", "properties": {"path": "string"}})]}, 422),
    ({"messages": USER, "tools": [_tool({"type": "object", "properties": {}, "required": 5})]}, 422),
    ({"messages": USER, "tools": [_tool({"type": "object", "properties": {}, "required": [5]})]}, 422),
    ({"messages": USER, "tools": [_tool({"type": "object", "properties": {}, "required": ["nope"]})]}, 422),
    ({"messages": USER, "tools": [_tool({"type": "object", "properties": [{"path": {"type": "string"}}]})]}, 422),
    ({"messages": USER, "tools": [_tool({"type": "object", "properties": {"p": {"type": 7}}})]}, 422),
    ({"messages": USER, "tools": [_tool({"type": "array"})]}, 422),
    ({"messages": USER, "tools": [_tool("bad")]}, 422),
    ({"messages": USER, "tools": [{"type": "function", "function": {"name": "a b"}}]}, 422),
    ({"messages": USER, "tools": [_tool({})], "tool_choice": {"type": "function", "function": "ls"}}, 422),
    ({"messages": USER, "tools": [_tool({})], "tool_choice": {"type": "function", "function": {"name": "rm"}}}, 400),
    ({"messages": USER, "tools": [_tool({})], "tool_choice": "sometimes"}, 422),
    ({"messages": USER, "tools": [_tool({})], "tool_choice": 3}, 422),
    ({"messages": [{"role": "user", "content": "a\ud800b"}]}, 400),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}]}, 400),
    ({"messages": USER, "user": "\ud83d"}, 400),
    ({"messages": USER, "max_tokens": 1_000_000_000}, 400),
    ({"messages": USER, "max_completion_tokens": CAP + 1}, 400),
    ({"messages": USER, "max_tokens": 0}, 422),
    ({"messages": USER, "max_tokens": "many"}, 422),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400),
    ({"messages": [{"role": "robot", "content": "x"}]}, 422),
    ({"messages": [{"role": "system", "content": "x"}]}, 422),
    ({"messages": USER, "extra": _deep(100)}, 400),
    ([1, 2], 422),
    ("text", 422),
    (None, 422),
])
def test_bad_chat_requests_are_4xx(body, status):
    assert _status(body) == status


def test_max_tokens_error_names_the_cap():
    with pytest.raises(BadRequest, match=f"at most {CAP}"):
        parse_chat({"messages": USER, "max_tokens": 10**9}, CAP)


def test_check_json_depth_and_unicode():
    assert check_json({"a": [1, {"b": "ok"}]}) is None
    assert check_json(_deep(64)) is None and "deeper than 64" in check_json(_deep(65))
    assert "not valid Unicode" in check_json({"k": ["x", "a\ud800b"]})
    assert "key" in check_json({"\ud800": 1})
    with pytest.raises(RecursionError):  # what json.loads does with 1,000 levels: the edge turns it into a 400
        json.loads("[" * 100_000 + "]" * 100_000)


def test_interaction_log_takes_concurrent_writers(tmp_path):
    """The answers of one batch finish together: their records are written from many threads at once."""
    import threading

    from actors.events import ChatMessage, Interaction
    from serve.interactions import InteractionLog

    log = InteractionLog(tmp_path / "i.db")
    evs = [Interaction(interaction_id=f"i{i}", user_hash="u", messages=[ChatMessage(role="user", content="hi")],
                       response=ChatMessage(role="assistant", content=str(i))) for i in range(64)]
    errors = []

    def put(chunk):
        try:
            for e in chunk:
                log.put(e)
                assert log.get(e.interaction_id).response.content == e.response.content
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
    threads = [threading.Thread(target=put, args=(evs[i::8],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and all(log.get(f"i{i}") for i in range(64))
