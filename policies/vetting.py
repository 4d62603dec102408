"""What Serve lets out as a tool call: only calls a client can run (`trusted_calls`)."""

from __future__ import annotations

import json
import re

from actors.events import ChatMessage, ToolCall, ToolSpec
from envs.tool_fit import misfit


def json_object(text: str) -> dict | None:
    """The JSON object `text` holds, or None."""
    try:
        v = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return v if isinstance(v, dict) else None


def trusted_calls(msg: ChatMessage, tools: list[ToolSpec], text: str, cut: bool, forced: bool = False) -> ChatMessage:
    """Only calls a client can run: to a declared function, with a JSON object of arguments (positional arguments
    of a Python-style call named by the declared parameters, in order). Anything else is the model's text, answered
    as text (its tokens unchanged, so the learner trains what was generated); a last call cut off by the token
    limit is kept as the reference keeps it, finishing with `length`.

    A `forced` call (`tool_choice` "required" or a named function) is always the answer, never its markup as text:
    with arguments that are not a JSON object it goes out with their raw text, as the reference's non-strict mode
    can answer; later calls a client cannot run are left out."""
    declared = {t.function.name: t.function for t in tools}
    cut = call_cut(text, cut)
    if cut and msg.tool_calls and msg.tool_calls[-1].name == "invalid_call":
        msg = msg.model_copy(update={"tool_calls": [*msg.tool_calls[:-1], _open_call(text, msg.tool_calls[-1])]})
    as_text = ChatMessage(role="assistant", content=text.replace("<|im_end|>", "").strip())
    calls = []
    for i, c in enumerate(msg.tool_calls):
        vetted = _runnable(c, declared, cut and i == len(msg.tool_calls) - 1)
        if vetted is None and forced and i == 0 and c.name in declared:
            vetted = ToolCall(id=c.id, name=c.name, arguments=raw_arguments(c.arguments))
        if vetted is None and not forced:
            return as_text
        if vetted is not None:
            calls.append(vetted)
    return ChatMessage(role="assistant", content=msg.content, tool_calls=calls)


# one call's opening inside a `<tool_call>` block, up to its arguments (serve's forced prefix and the model's own text)
CALL_HEAD = re.compile(r'\s*\[?\s*\{\s*"name":\s*"([^"]+)",\s*"arguments":\s*')


def _open_call(text: str, c: ToolCall) -> ToolCall:
    """The call the token limit cut off inside its `<tool_call>`, as far as it got: its name and its partial arguments
    (the reference's `length` answer), when the block opens one call by name; else `c` as parsed."""
    block = text[text.rfind("<tool_call>") + len("<tool_call>") :].replace("<|im_end|>", "")
    m = CALL_HEAD.match(block)
    if m is None or '"name":' in block[m.end() :]:  # not one call's opening: nothing to name it by
        return c
    return ToolCall(id=c.id, name=m.group(1), arguments=block[m.end() :].rstrip())


def call_cut(text: str, cut: bool) -> bool:
    """The token limit (`cut`) cut a call off, not the text after one: the last `<tool_call>` is still open."""
    return cut and text.rfind("<tool_call>") > text.rfind("</tool_call>")


def _runnable(c: ToolCall, declared: dict, cut: bool) -> ToolCall | None:
    """The call as a client can run it, or None; `cut`: the token limit cut it off (kept with partial arguments). A
    `strict` function's call runs only with arguments that match its parameters (`envs.tool_fit.misfit`)."""
    if c.name not in declared:
        return None
    args = json_object(c.arguments)
    if args is None:
        return c if cut else None
    if "_positional" in args:
        given = args.pop("_positional")
        free = [p for p in (declared[c.name].parameters or {}).get("properties", {}) if p not in args]
        if not isinstance(given, list) or len(given) > len(free):
            return None
        c = ToolCall(id=c.id, name=c.name, arguments=json.dumps({**dict(zip(free, given)), **args}))
    if declared[c.name].strict and misfit([c], [ToolSpec(function=declared[c.name])]) is not None:
        return None
    return c


def raw_arguments(text: str) -> str:
    """The arguments a forced call wrote, less the markup that closes the call (`}]</tool_call>` and what follows):
    `parse_forced` keeps everything after the forced opening as the arguments of a call that did not parse."""
    if "</tool_call>" not in text:
        return text  # cut off before the call closed: all of it is arguments
    head = text.split("</tool_call>", 1)[0].rstrip()
    head = head[:-1].rstrip() if head.endswith("]") else head
    if json_object(head) is not None:  # the arguments closed and the call's own brace is missing: they are all of it
        return head
    return head[:-1].rstrip() if head.endswith("}") else head
