"""Prompt rendering (ChatML, as SmolLM2's template) with tools, and tool-call parsing.

Tools are listed compactly in the system message (one line per function) to keep CPU prompts
short; the model calls them with `<tool_call>[{"name": ..., "arguments": {...}}]</tool_call>`.
Python call syntax (`name(a=1)`) is also accepted and parsed with `ast`, never eval'd.
`render()` is prefix-stable, so step token spans can be recovered from character offsets.
"""

from __future__ import annotations

import json
import re
import uuid

from actors.events import DEFAULT_SYSTEM, ChatMessage, ToolCall, ToolSpec
from envs.tool_calls import CallError, parse_python_call
from policies.vetting import CALL_HEAD, json_object, raw_arguments, trusted_calls  # noqa: F401  (re-exported: callers import them from here)

_CALL_RE = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)


def _compact_tool(spec: ToolSpec) -> dict:
    f = spec.function
    params = f.parameters or {}
    props = {
        k: {"type": v.get("type", "string"), **({"description": v["description"][:80]} if v.get("description") else {})}
        for k, v in (params.get("properties") or {}).items()
    }
    return {
        "name": f.name,
        "description": (f.description or "").strip().split("\n")[0][:120],
        "parameters": {"type": "object", "properties": props, "required": params.get("required", [])},
    }


def _param_line(spec: ToolSpec) -> str:
    f = spec.function
    schema = f.parameters
    props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    req = {r for r in schema.get("required") or [] if isinstance(r, str)} if isinstance(schema.get("required"), list) else set()
    params = ", ".join(
        f"{k}{'' if k in req else '?'}: {v.get('type', 'any') if isinstance(v, dict) else 'any'}" for k, v in props.items()
    )
    desc = (f.description or "").strip().split("\n")[0][:140]
    return f"- {f.name}({params}): {desc}"


CALL_OPEN = "<tool_call>"  # where a call begins in the model's text
CALL_PREFIX = '<tool_call>[{"name": "'


def required_keys(spec: ToolSpec) -> list[str]:
    """The required parameters a (client's) schema names, in its order; whatever else it holds there is ignored."""
    req = (spec.function.parameters or {}).get("required") if isinstance(spec.function.parameters, dict) else None
    return [k for k in req if isinstance(k, str)] if isinstance(req, list) else []


def enum_texts(enum, after: str = "") -> list[str]:
    """The JSON texts of a declared enum's values, each less its opening `after` (a string's quote, written already),
    as constrained decoding can choose among them; none where it cannot: not a non-empty list of strings, numbers or
    booleans, a value that does not start with `after`, or one text the start of another (1 and 10: decoding that
    stops when no option goes on would never pick 1)."""
    if not isinstance(enum, list) or not enum or not all(isinstance(v, (str, int, float, bool)) for v in enum):
        return []
    texts = list(dict.fromkeys(json.dumps(v, ensure_ascii=False) for v in enum))  # as the model writes JSON
    if not all(t.startswith(after) for t in texts):
        return []
    texts = [t[len(after) :] for t in texts]
    return [] if any(a != b and b.startswith(a) for a in texts for b in texts) else texts


def value_opening(spec: ToolSpec, key: str) -> str:
    """What opens the value of parameter `key` in a call's JSON: a quote where the schema says string, else nothing."""
    props = spec.function.parameters.get("properties") if isinstance(spec.function.parameters, dict) else None
    prop = props.get(key) if isinstance(props, dict) else None
    return '"' if isinstance(prop, dict) and prop.get("type") == "string" else ""


def call_opening(spec: ToolSpec, grammar: bool = False) -> str:
    """The start of a call of this function, with its first required argument opened, as
    schema-guided decoding would write it; with `grammar`, for a `strict` function (whose arguments the serving
    edge's grammar writes whole, `policies.grammar.response_grammar`), only the place of its arguments."""
    if grammar and spec.function.strict:
        return f'<tool_call>[{{"name": "{spec.function.name}", "arguments": '
    required = required_keys(spec)
    head = json.dumps(required[0]) + ": " + value_opening(spec, required[0]) if required else ""
    return f'<tool_call>[{{"name": "{spec.function.name}", "arguments": {{{head}'


def tool_choice_prefix(choice, tools: list[ToolSpec], grammar: bool = False) -> str:
    """Text that forces OpenAI's `tool_choice` (appended to the prompt, kept in the parsed answer):
    "auto" / None -> nothing; "required" -> the start of a call (an engine that can `choose` then
    picks one of the declared names by constrained decoding, see `call_opening`); {"type":
    "function", "function": {"name": f}} -> the start of a call of f. ("none" is handled by not
    offering the tools.)"""
    if not tools or choice in (None, "auto", "none"):
        return ""
    if choice == "required":
        return CALL_PREFIX
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        spec = next((t for t in tools if t.function.name == name), None)
        if spec is None:
            raise ValueError(f"tool_choice names function {name!r}, which is not among the request's tools")
        return call_opening(spec, grammar)
    raise ValueError(f"tool_choice {choice!r} is not supported; use auto, none, required or a function")


def tools_block(tools: list[ToolSpec], experiences: list[str] | None = None) -> str:
    out = []
    if tools:
        out.append("You can call these functions:\n" + "\n".join(_param_line(t) for t in tools))
        out.append(
            'To call functions, reply only with <tool_call>[{"name": "function_name", "arguments": '
            '{"arg": "value"}}]</tool_call>. After the results arrive, continue or answer in text.'
        )
    if experiences:
        out.append("Experience from earlier tasks (use it if it applies):\n" + "\n".join(f"* {e}" for e in experiences))
    return "\n\n".join(out)


def assistant_text(m: ChatMessage) -> str:
    """The content of an assistant turn as the model writes it (tool calls in their tags). Arguments that are not
    JSON (a forced call Serve answered with the text its model wrote, `policies.vetting.raw_arguments`) go in as
    written, so the turn reads as it was generated."""
    if not m.tool_calls:
        return m.content
    prefix = (m.content + "\n") if m.content else ""
    return prefix + "<tool_call>[" + ", ".join(_call_text(c.name, c.arguments) for c in m.tool_calls) + "]</tool_call>"


def _call_text(name: str, arguments: str) -> str:
    try:
        call = {"name": name, "arguments": json.loads(arguments) if arguments.strip() else {}}  # "": no arguments
    except (json.JSONDecodeError, TypeError, RecursionError):
        return '{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments": ' + arguments + "}"
    text = json.dumps(call, ensure_ascii=False)  # as written: München
    if any("\ud800" <= ch <= "\udfff" for ch in text):  # half a surrogate pair no tokenizer takes: kept escaped
        text = json.dumps(call)
    return text


_MARKER = re.compile(r"<\|([A-Za-z_]{1,32})\|>")


def plain(text: str) -> str:
    """Text from a client, a tool or the model as data: a chat-template marker in it (`<|im_start|>`, `<|im_end|>`)
    is broken up so that the tokenizer reads it as text, never as the start or end of a turn of another role."""
    return _MARKER.sub(r"< |\1| >", text) if "<|" in text else text


def render(
    messages: list[ChatMessage],
    tools: list[ToolSpec] | None = None,
    experiences: list[str] | None = None,
    add_generation_prompt: bool = True,
) -> str:
    """ChatML text; tools and experiences go into the system message."""
    msgs = list(messages)
    extra = tools_block(tools or [], experiences)
    if not msgs or msgs[0].role != "system":
        msgs.insert(0, ChatMessage(role="system", content=DEFAULT_SYSTEM))
    parts = []
    for i, m in enumerate(msgs):
        content = m.content
        if i == 0 and extra:
            content = f"{content}\n\n{extra}"
        elif m.role == "assistant":
            content = assistant_text(m)
        elif m.role == "tool":
            content = "<tool_response>" + m.content.replace("</tool_response>", "</ tool_response>") + "</tool_response>"
        parts.append(f"<|im_start|>{m.role}\n{plain(content)}<|im_end|>\n")
    if add_generation_prompt:
        parts.append("<|im_start|>assistant\n")
    return "".join(parts)


def assistant_spans(
    messages: list[ChatMessage],
    tools: list[ToolSpec] | None = None,
    experiences: list[str] | None = None,
    only: list[int] | None = None,
) -> tuple[str, list[tuple[int, int]]]:
    """Full text and the character span of each assistant message's content (+ its <|im_end|>); with `only`,
    of the messages at those indices only (a sample's steps: earlier assistant turns of a live conversation are
    context, not actions of this sample)."""
    spans = []
    for i, m in enumerate(messages):
        if m.role != "assistant" or (only is not None and i not in only):
            continue
        start = len(render(messages[:i], tools, experiences, add_generation_prompt=True))
        end = len(render(messages[: i + 1], tools, experiences, add_generation_prompt=False))
        spans.append((start, end - 1))  # exclude the trailing newline after <|im_end|>
    return render(messages, tools, experiences, add_generation_prompt=False), spans


def parse_forced(forced: str, text: str) -> ChatMessage:
    """The answer to a request whose call was forced (`tool_choice`): a call cut off by the token limit
    keeps the forced name, with the partial arguments text as its arguments (as OpenAI returns a
    truncated call), instead of becoming `invalid_call`; a call that closed keeps only what it wrote before closing."""
    msg = parse_assistant(forced + text)
    m = CALL_HEAD.match(forced, len(CALL_OPEN)) if forced.startswith(CALL_OPEN) else None
    if m and msg.tool_calls and msg.tool_calls[0].name == "invalid_call":
        args = raw_arguments((forced + text)[m.end() :].replace("<|im_end|>", "").strip())
        msg.tool_calls[0] = ToolCall(id=msg.tool_calls[0].id, name=m.group(1), arguments=args)
    return msg


def served_answer(forced: str, text: str, tools: list[ToolSpec], cut: bool) -> ChatMessage:
    """The answer Serve sends for a generation `text` after the `forced` opening (empty when nothing was forced): parsed
    (`parse_forced`) and vetted (`trusted_calls`); `cut`: the token limit ended it. Held-out scoring reads its forced
    answers the same way (`policies/rollout.py`)."""
    return trusted_calls(parse_forced(forced, text), tools, forced + text, cut, forced=bool(forced))


def parse_assistant(text: str, allow_python: bool = True) -> ChatMessage:
    """Turn generated text into an assistant message with tool_calls where the model made some.

    Malformed calls are kept as calls with the raw text as arguments, so the environment can
    answer them with an error observation instead of silently dropping them."""
    text = text.replace("<|im_end|>", "").strip()
    calls: list[ToolCall] = []
    for block in _CALL_RE.findall(text):
        block = block.strip()
        items = _loads_lenient(block)
        if isinstance(items, dict):
            items = [items]
        if isinstance(items, list):
            for it in items:
                if isinstance(it, dict) and isinstance(it.get("name"), str):
                    args = it.get("arguments", {})
                    calls.append(
                        ToolCall(id=_cid(), name=it["name"], arguments=args if isinstance(args, str) else json.dumps(args))
                    )
                else:
                    calls.append(ToolCall(id=_cid(), name="invalid_call", arguments=json.dumps({"raw": str(it)[:500]})))
        elif allow_python and block:
            calls.extend(_python_calls(block))
    content = _CALL_RE.sub("", text).strip() if calls else text
    if not calls and allow_python:
        calls = _python_calls(text, strict=True)
        if calls:
            content = ""
    return ChatMessage(role="assistant", content=content, tool_calls=calls)


_BARE_KEY = re.compile(r"([{,]\s*)([A-Za-z_][A-Za-z0-9_]*)\s*:")


def _loads_lenient(block: str):
    """JSON, or what small models often write instead: bare object keys ({city: "Paris"}), a valid
    call followed by junk, or a call list whose closing bracket is missing."""
    dec = json.JSONDecoder()
    for text in (block, _BARE_KEY.sub(r'\1"\2":', block)):
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            pass
        except RecursionError:  # nested deeper than the parser goes: no call
            return None
        for start in (0, 1) if text.startswith("[") else (0,):
            try:
                return dec.raw_decode(text[start:])[0]  # the longest valid JSON value at the start
            except json.JSONDecodeError:
                continue
            except RecursionError:
                return None
    return None


def _python_calls(block: str, strict: bool = False) -> list[ToolCall]:
    out = []
    for line in [s.strip().strip("[]") for s in block.splitlines() if s.strip()]:
        try:
            p = parse_python_call(line)
        except CallError:
            if strict:
                return []
            out.append(ToolCall(id=_cid(), name="invalid_call", arguments=json.dumps({"raw": line[:500]})))
            continue
        if p.args:
            if strict:
                return []
            out.append(ToolCall(id=_cid(), name=p.name, arguments=json.dumps({"_positional": list(p.args), **p.kwargs})))
        else:
            out.append(ToolCall(id=_cid(), name=p.name, arguments=json.dumps(p.kwargs)))
    return out


def _cid() -> str:
    return "call_" + uuid.uuid4().hex[:12]
