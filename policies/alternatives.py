"""A live step's alternatives: new answers to the context users were answered in (the explorer's side of a live step).

Most of what the default model samples for a tool request cannot be right by the schema alone: it writes the first
argument and closes the call, leaving the others out (`tests/benchmarks/LOG.md`, 2026-11-28). Re-samples of such a
step rarely fit, so a group of them has little to tell apart. Some alternatives are therefore *schema-guided*, as
JSON-schema-guided decoding writes a call: the keys of the function's required parameters are forced in order, each
value opened as its type opens (a string's quote, an array's bracket, an object's brace), and the model writes every
value (and whatever follows the last one), or chooses it among the values of a declared enum, by constrained
decoding. A guided alternative names every required parameter; its values, and whether it fits at all, are still
the model's. It is scored like any other (`envs/live.py`), and trained like the forced call opening everywhere
else here: as the policy's own sample.

Every alternative is vetted as Serve vets an answer (`policies.chat.trusted_calls`). One that our own token budget cut
off in the middle of a call is left out of the group: it was not the model's to finish, so it is not scored.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

from actors.events import ChatMessage, Sample, ToolSpec
from policies.chat import (
    CALL_OPEN,
    CALL_PREFIX,
    call_opening,
    enum_texts,
    json_object,
    parse_assistant,
    parse_forced,
    render,
    required_keys,
    tool_choice_prefix,
    trusted_calls,
    value_opening,
)
from policies.grammar import response_grammar
from policies.rollout import forced_prefix

VALUE_TOKENS = 64  # the most one guided value may take


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


_OPENERS = {"string": '"', "array": "[", "object": "{"}


def opener(spec: ToolSpec, key: str) -> str:
    """What a guided value of parameter `key` starts with, as schema-guided decoding forces it: the quote of a string,
    the bracket of an array or the brace of an object; nothing for other types."""
    props = spec.function.parameters.get("properties") if isinstance(spec.function.parameters, dict) else None
    prop = props.get(key) if isinstance(props, dict) else None
    return _OPENERS.get(prop.get("type"), "") if isinstance(prop, dict) and isinstance(prop.get("type"), str) else ""


def value_end(text: str, opened: str = "") -> int | None:
    """Where the JSON value at the start of `text` ends, `opened` (its first character, when it is already written)
    included, or None when `text` does not start with a whole JSON value (NaN and Infinity are not JSON)."""
    dec = json.JSONDecoder(parse_constant=_no_constant)
    try:
        if opened:
            return dec.raw_decode(opened + text)[1] - len(opened)
        lead = len(text) - len(text.lstrip())
        return dec.raw_decode(text, lead)[1] if text.strip() else None
    except (ValueError, RecursionError):
        return None


def enum_options(spec: ToolSpec, key: str) -> list[str]:
    """The rest of each value parameter `key` may take, after its opening (`opener`), where the schema declares an enum
    constrained decoding can choose from (`enum_texts`); else none (the model writes the value)."""
    props = spec.function.parameters.get("properties") if isinstance(spec.function.parameters, dict) else None
    prop = props.get(key) if isinstance(props, dict) else None
    return enum_texts(prop.get("enum"), opener(spec, key)) if isinstance(prop, dict) else []


def guided_calls(engine, context: str, spec: ToolSpec, n: int, *, max_new_tokens: int, temperature: float, top_p: float):
    """`n` calls of `spec` after `context`, its required parameters' keys, and the opening of each value, forced in
    order, each value written by the model (module docstring), or chosen by it among an enum's values. Returns, per
    call, the prefix and the text after it and whether our budget cut it off; and the tokens generated."""
    required = required_keys(spec)
    opening = call_opening(spec)  # it wrote the first key and opened its value if it is a string
    first = opener(spec, required[0])[len(value_opening(spec, required[0])) :] if required else ""
    texts, cut, tokens, open_ = [first] * n, [False] * n, 0, list(range(n))
    for j, key in enumerate(required):
        if not open_:  # every call stopped before this key
            break
        options = enum_options(spec, key)
        if options:  # one of the declared values, by constrained decoding (as `PolicyGenerator.call_arguments`)
            picks = [engine.choose(context + opening + texts[i], options, temperature) for i in open_]
            gens = [SimpleNamespace(text=p, completion_tokens=engine.count_tokens(p), finish_reason="stop") for p in picks]
        else:
            gens = engine.generate([context + opening + texts[i] for i in open_], VALUE_TOKENS, temperature, top_p)
        nxt = []
        for i, g in zip(open_, gens):
            tokens += g.completion_tokens
            end = value_end(g.text, opener(spec, key))
            if end is None:  # not a value: the call is left as the model wrote it, or as our budget cut it
                texts[i], cut[i] = texts[i] + g.text, g.finish_reason == "length"
                continue
            texts[i] += g.text[:end]
            if j + 1 < len(required):
                texts[i] += ", " + json.dumps(required[j + 1]) + ": " + opener(spec, required[j + 1])
            nxt.append(i)
        open_ = nxt
    if open_:  # after the last required value: the model goes on (more arguments, or it closes the call)
        budget = max(16, max_new_tokens - tokens // max(1, n))
        for i, g in zip(open_, engine.generate([context + opening + texts[i] for i in open_], budget, temperature, top_p)):
            tokens += g.completion_tokens
            texts[i], cut[i] = texts[i] + g.text, g.finish_reason == "length"
    return [(opening, t, c) for t, c in zip(texts, cut)], tokens


def _vetted(tools: list[ToolSpec], prefix: str, text: str, cut: bool) -> ChatMessage | None:
    """The answer as Serve would give it, or None when our budget cut it off inside a call."""
    msg = trusted_calls(parse_forced(prefix, text) if prefix else parse_assistant(text), tools, prefix + text, cut)
    if msg.tool_calls:
        inside = json_object(msg.tool_calls[-1].arguments) is None
    else:
        inside = CALL_OPEN in prefix + text  # a call was opened and did not parse
    return None if cut and inside else msg


def resample_step(
    engine,
    step: Sample,
    tool_choice,
    n: int,
    *,
    max_new_tokens: int,
    temperature: float,
    top_p: float = 1.0,
    guided: int = 0,
    response_format: dict | None = None,
) -> tuple[list[ChatMessage], int]:
    """Up to `n` new answers to the context of a live step (`step`: a one-step sample, its answer last), generated as
    Serve answers that request: the same prompt, and a call forced as its `tool_choice` forced one (a declared name
    chosen by constrained decoding for "required"). Where the served answer called a declared function, every
    alternative calls that one (the declared schema can judge a call's arguments, not which function the user meant,
    so the group differs only where it is scored), and the first `guided` of them are schema-guided (`guided_calls`).
    An answer that is not a call follows the grammar Serve's followed (the request's `response_format`, or its strict
    functions'). Answers our budget cut off inside a call are left out. Returns the answers and the tokens generated."""
    i = step.step_indices[-1]
    context = render(step.messages[:i], step.tools)
    forced = tool_choice_prefix(tool_choice, step.tools)
    served = {t.function.name: t for t in step.tools}.get(next((c.name for c in step.messages[i].tool_calls), None))
    guided = min(guided, n) if served is not None else 0
    raw, tokens = [], 0
    if guided:
        raw, tokens = guided_calls(
            engine, context, served, guided, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p
        )
    if served is not None:
        forced = call_opening(served)
    prefixes = [
        forced_prefix(step.tools, engine, context, temperature) if forced == CALL_PREFIX else forced for _ in range(n - guided)
    ]
    if prefixes:
        grammar = response_grammar(response_format, step.tools, bool(forced), call_tokens=getattr(engine, "call_tokens", False))
        gens = engine.generate(
            [context + p for p in prefixes], max_new_tokens, temperature=temperature, top_p=top_p, grammar=grammar
        )
        raw += [(p, g.text, g.finish_reason == "length") for p, g in zip(prefixes, gens)]
        tokens += sum(g.completion_tokens for g in gens)
    answers = [_vetted(step.tools, p, t, c) for p, t, c in raw]
    return [a for a in answers if a is not None], tokens
