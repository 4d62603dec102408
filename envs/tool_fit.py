"""Does a call fit the tools the client declared? Checked with nothing but the request itself.

A client that sends `tools` declares each function's name and the JSON Schema of its arguments. A call that names
no declared function, whose arguments are not a JSON object, that leaves out a required parameter, passes one the
function does not declare, or gives a value of the wrong type (or outside its `enum`) is wrong whatever the user
wanted: the client's tool would refuse it or misread it. That needs no user, no rating and no run of the tool, so it
scores an answer nobody saw (the explorer's re-samples of a live step) as surely as one the user answered.

The schema is checked by `jsonschema` (the draft the schema names, else 2020-12). One tightening: where a schema lists
`properties` and says nothing of `additionalProperties`, a parameter outside them does not fit (a Python function, or
an OpenAI strict tool, refuses an unknown keyword); a schema that says `additionalProperties` keeps its word. A
schema that is not valid JSON Schema cannot judge a call: such a call fits, as far as this check can tell.
"""

from __future__ import annotations

import json

from jsonschema import exceptions, validators

from actors.events import ToolCall, ToolSpec


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
        if not isinstance(args, dict):
            return f"the arguments of {call.name} are not a JSON object"
        schema = _closed(declared[call.name])
        cls = validators.validator_for(schema, default=validators.Draft202012Validator)
        try:
            cls.check_schema(schema)
        except exceptions.SchemaError:
            continue  # the client's schema is not JSON Schema: it cannot judge this call
        error = exceptions.best_match(cls(schema).iter_errors(args))
        if error is not None:
            where = "/".join(map(str, error.absolute_path))
            return f"{call.name}: {error.message}" + (f" (at {where})" if where else "")
    return None
