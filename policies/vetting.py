"""What Serve lets out as a tool call: only calls a client can run (`trusted_calls`)."""

from __future__ import annotations

import json

from actors.events import ChatMessage, ToolCall, ToolSpec


def json_object(text: str) -> dict | None:
    """The JSON object `text` holds, or None."""
    try:
        v = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return v if isinstance(v, dict) else None


def trusted_calls(msg: ChatMessage, tools: list[ToolSpec], text: str, cut: bool) -> ChatMessage:
    """Only calls a client can run: to a declared function, with a JSON object of arguments (positional arguments
    of a Python-style call named by the declared parameters, in order). Anything else is the model's text, answered
    as text (its tokens unchanged, so the learner trains what was generated); a last call cut off by the token
    limit is kept as the reference keeps it, finishing with `length`."""
    declared = {t.function.name: t.function for t in tools}
    as_text = ChatMessage(role="assistant", content=text.replace("<|im_end|>", "").strip())
    calls = []
    for i, c in enumerate(msg.tool_calls):
        args = json_object(c.arguments)
        if c.name in declared and args is None and cut and i == len(msg.tool_calls) - 1:
            calls.append(c)
            continue
        if c.name not in declared or args is None:
            return as_text
        if "_positional" in args:
            given = args.pop("_positional")
            free = [p for p in (declared[c.name].parameters or {}).get("properties", {}) if p not in args]
            if not isinstance(given, list) or len(given) > len(free):
                return as_text
            c = ToolCall(id=c.id, name=c.name, arguments=json.dumps({**dict(zip(free, given)), **args}))
        calls.append(c)
    return ChatMessage(role="assistant", content=msg.content, tool_calls=calls)
