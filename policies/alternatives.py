"""A live step's alternatives: new answers to the context users were answered in (the explorer's side of a live step).

Most of what the default model samples for a tool request cannot be right by the schema alone: it writes the first
argument and closes the call, leaving the others out (`tests/benchmarks/LOG.md`, 2026-11-28). Re-samples of such a
step rarely fit, so a group of them has little to tell apart. Some alternatives are therefore *schema-guided*, as
JSON-schema-guided decoding writes a call: the keys of the function's required parameters are forced in order and
the model writes every value (and whatever follows the last one). A guided alternative names every required
parameter; its values, and whether it fits at all, are still the model's. It is scored like any other
(`envs/live.py`), and trained like the forced call opening everywhere else here: as the policy's own sample.
"""

from __future__ import annotations

import json

from actors.events import ChatMessage, Sample, ToolSpec
from policies.chat import CALL_PREFIX, call_opening, parse_assistant, parse_forced, render, tool_choice_prefix
from policies.rollout import forced_prefix

VALUE_TOKENS = 48  # the most one guided value may take


def value_end(text: str, in_string: bool) -> int | None:
    """Where the JSON value at the start of `text` ends (`in_string`: its opening quote is already written), or None
    when `text` does not start with a whole JSON value."""
    dec = json.JSONDecoder()
    try:
        if in_string:
            return dec.raw_decode('"' + text)[1] - 1
        lead = len(text) - len(text.lstrip())
        return dec.raw_decode(text, lead)[1] if text.strip() else None
    except ValueError:
        return None


def _opens_string(spec: ToolSpec, key: str) -> bool:
    return ((spec.function.parameters.get("properties") or {}).get(key) or {}).get("type") == "string"


def guided_calls(engine, context: str, spec: ToolSpec, n: int, *, max_new_tokens: int, temperature: float, top_p: float):
    """`n` calls of `spec` after `context`, its required parameters' keys forced in order, each value written by the
    model (module docstring). Returns (the text after `call_opening(spec)` per call, tokens generated)."""
    opening = call_opening(spec)
    required = [k for k in spec.function.parameters.get("required") or [] if isinstance(k, str)]
    texts, open_, tokens = [""] * n, list(range(n)), 0
    for j, key in enumerate(required):  # call_opening wrote the first key and opened its value
        gens = engine.generate([context + opening + texts[i] for i in open_], VALUE_TOKENS, temperature=temperature, top_p=top_p)
        nxt = []
        for i, g in zip(open_, gens):
            tokens += g.completion_tokens
            end = value_end(g.text, _opens_string(spec, key))
            if end is None:  # not a value: the call is left as the model wrote it
                texts[i] += g.text
                continue
            texts[i] += g.text[:end]
            if j + 1 < len(required):
                texts[i] += ", " + json.dumps(required[j + 1]) + ": " + ('"' if _opens_string(spec, required[j + 1]) else "")
            nxt.append(i)
        open_ = nxt
    if open_:  # after the last required value: the model goes on (more arguments, or it closes the call)
        budget = max(16, max_new_tokens - tokens // max(1, n))
        for i, g in zip(open_, engine.generate([context + opening + texts[i] for i in open_], budget, temperature, top_p)):
            tokens += g.completion_tokens
            texts[i] += g.text
    return [parse_forced(opening, t) for t in texts], tokens


def resample_step(
    engine, step: Sample, tool_choice, n: int, *, max_new_tokens: int, temperature: float, top_p: float = 1.0, guided: int = 0
) -> tuple[list[ChatMessage], int]:
    """`n` new answers to the context of a live step (`step`: a one-step sample, its answer last), generated as
    Serve answers that request: the same prompt, and a call forced as its `tool_choice` forced one (a declared name
    chosen by constrained decoding for "required"). Where the served answer called a declared function, every
    alternative calls that one (the declared schema can judge a call's arguments, not which function the user meant,
    so the group differs only where it is scored), and the first `guided` of them are schema-guided (`guided_calls`).
    Returns the answers and the tokens generated."""
    i = step.step_indices[-1]
    context = render(step.messages[:i], step.tools)
    forced = tool_choice_prefix(tool_choice, step.tools)
    served = {t.function.name: t for t in step.tools}.get(next((c.name for c in step.messages[i].tool_calls), None))
    guided = min(guided, n) if served is not None else 0
    answers, tokens = [], 0
    if guided:
        answers, tokens = guided_calls(
            engine, context, served, guided, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p
        )
    if served is not None:
        forced = call_opening(served)
    prefixes = [
        forced_prefix(step.tools, engine, context, temperature) if forced == CALL_PREFIX else forced for _ in range(n - guided)
    ]
    if prefixes:
        gens = engine.generate([context + p for p in prefixes], max_new_tokens, temperature=temperature, top_p=top_p)
        answers += [parse_forced(p, g.text) if p else parse_assistant(g.text) for p, g in zip(prefixes, gens)]
        tokens += sum(g.completion_tokens for g in gens)
    return answers, tokens
