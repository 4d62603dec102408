"""Does a call fit the tools the client declared? Checked with nothing but the request itself.

A client that sends `tools` declares each function's name and the JSON Schema of its arguments. A call that names
no declared function, whose arguments are not a JSON object, that leaves out a required parameter, passes one the
function does not declare, or gives a value of the wrong type (or outside its `enum`) is wrong whatever the user
wanted: the client's tool would refuse it or misread it. That needs no user, no rating and no run of the tool, so it
scores an answer nobody saw (the explorer's re-samples of a live step) as surely as one the user answered.

The schema is checked by `jsonschema` (the draft the schema names, else 2020-12). One tightening: where a schema lists
`properties` and says nothing of `additionalProperties`, a parameter outside them does not fit (a Python function, or
an OpenAI strict tool, refuses an unknown keyword); a schema that says `additionalProperties` keeps its word. The
schema is the client's, so it is data: its `$ref`s resolve only within itself (nothing is fetched), and a schema that
is not valid JSON Schema, or that the check cannot follow, cannot judge a call: such a call fits, as far as this check
can tell. Arguments nested too deep to read do not fit.
"""

from __future__ import annotations

import json

from jsonschema import exceptions, validators
from referencing import Registry

from actors.events import ToolCall, ToolSpec

_NOTHING = Registry()  # no retrieval: a `$ref` to anything outside the schema is unresolvable, never fetched


def _closed(schema: dict) -> dict:
    if isinstance(schema.get("properties"), dict) and "additionalProperties" not in schema:
        return {**schema, "additionalProperties": False}
    return schema


def misfit(calls: list[ToolCall], tools: list[ToolSpec]) -> str | None:
    """Why these calls do not fit the declared tools (the first reason), or None when every one does."""
    declared = {t.function.name: t.function.parameters or {} for t in tools}
    for call in calls:
        if call.name not in declared:
            return f"{call.name!r} is not one of the declared functions"
        try:
            args = json.loads(call.arguments) if (call.arguments or "").strip() else {}
        except json.JSONDecodeError as exc:
            return f"the arguments of {call.name} are not valid JSON: {exc.msg}"
        except RecursionError:
            return f"the arguments of {call.name} are nested too deep"
        if not isinstance(args, dict):
            return f"the arguments of {call.name} are not a JSON object"
        schema = declared[call.name]
        try:
            schema = _closed(schema) if isinstance(schema, dict) else schema
            cls = validators.validator_for(schema, default=validators.Draft202012Validator)
            cls.check_schema(schema)
            error = exceptions.best_match(cls(schema, registry=_NOTHING).iter_errors(args))
        except Exception:  # not JSON Schema, an unresolvable $ref, ...: the client's schema cannot judge this call
            continue
        if error is not None:
            where = "/".join(map(str, error.absolute_path))
            return f"{call.name}: {error.message}" + (f" (at {where})" if where else "")
    return None


def calls_fit(sample) -> bool:
    """Every step of a rollout sample called declared functions with arguments that fit their schemas (`misfit`):
    what a call must get right before its values can be right. A step without a call does not fit."""
    steps = [sample.messages[i] for i in sample.step_indices if i < len(sample.messages)]
    return bool(steps) and all(m.tool_calls and misfit(m.tool_calls, sample.tools) is None for m in steps)
