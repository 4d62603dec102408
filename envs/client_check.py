"""Is a call the one a request asked for, when the request was written about a client's own function?

Practice on the clients' tools (the questioner's tasks written about the functions live requests declared) holds,
for each task, the call its request was written from: the reference. A rollout's calls are checked against it by
BFCL's own AST checker (`envs.bfcl_single.run_checker`), with the client's JSON Schema turned into BFCL's function
doc (`object` -> dict, `number` -> float) and the reference into BFCL's possible answer: each argument the reference
gives, its value; each optional argument it leaves out, omitted or the schema's `default`. So a call is right when
it names the function, gives every required argument the reference's value (strings compared as BFCL compares
them: case, spaces and `,./-_*^` ignored; an integer accepted for a number) and nothing the reference does not allow.
A task that asks for several calls in one answer (the same function with other values, as users ask "for A and for
B") is checked by BFCL's parallel checker: every reference call matched, in any order, and nothing more.

BFCL's checker reads the types of its doc, one level of nesting deep. A function whose schema it cannot read (a
property without one `type`, `anyOf` / `oneOf` / `allOf` / `$ref`, an array without an item type) is not practised:
`bfcl_doc` raises `Unjudgeable` with the reason. Nothing here runs a client's tool.
"""

from __future__ import annotations

import json

from actors.events import ToolCall, ToolSpec
from envs.bfcl_single import run_checker

_TYPES = {
    "object": "dict",
    "number": "float",
    "integer": "integer",
    "string": "string",
    "boolean": "boolean",
    "array": "array",
}
_COMBINED = ("anyOf", "oneOf", "allOf", "$ref")


class Unjudgeable(ValueError):
    """A schema BFCL's checker cannot read."""


def _doc_node(schema, where: str) -> dict:
    if not isinstance(schema, dict):
        raise Unjudgeable(f"{where} is not a schema object")
    for key in _COMBINED:
        if key in schema:
            raise Unjudgeable(f"{where} uses {key}")
    kind = schema.get("type")
    if not isinstance(kind, str) or kind not in _TYPES:
        raise Unjudgeable(f"{where} has type {kind!r}, not one of {sorted(_TYPES)}")
    out = {"type": _TYPES[kind]}
    for key in ("description", "enum", "default"):
        if key in schema:
            out[key] = schema[key]
    if kind == "array":
        out["items"] = _doc_node(schema.get("items"), f"{where}[]")
    if kind == "object" and isinstance(schema.get("properties"), dict):
        out["properties"] = {k: _doc_node(v, f"{where}.{k}") for k, v in schema["properties"].items()}
    return out


def bfcl_doc(spec: ToolSpec) -> dict:
    """The client's function as a BFCL function doc (raises `Unjudgeable` where the checker could not read it)."""
    f = spec.function
    params = f.parameters or {"type": "object", "properties": {}}
    if params.get("type", "object") != "object":
        raise Unjudgeable(f"{f.name}'s parameters are not an object")
    props = params.get("properties") or {}
    if not isinstance(props, dict):
        raise Unjudgeable(f"{f.name}'s properties are not an object")
    required = params.get("required") or []
    if not isinstance(required, list) or any(r not in props for r in required):
        raise Unjudgeable(f"{f.name} requires a parameter it does not describe")
    return {
        "name": f.name,
        "description": f.description,
        "parameters": {
            "type": "dict",
            "properties": {k: _doc_node(v, f"{f.name}.{k}") for k, v in props.items()},
            "required": list(required),
        },
    }


def _answer_value(value, kind: str):
    """One accepted value in BFCL's possible-answer form: a dict's values (and a list of dicts' values) are lists."""
    if isinstance(value, dict):
        return {k: [v] for k, v in value.items()}
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return [{k: [x] for k, x in v.items()} for v in value]
    if kind == "float" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def possible_answer(reference: ToolCall, doc: dict) -> dict:
    """BFCL's possible answer for a reference call: its arguments' values; each optional argument it leaves out may
    be omitted (`""`) or given its `default`. A reference that is not a call of the doc's function with every
    required argument raises `Unjudgeable`: a task must not teach a call its own schema refuses."""
    args = json.loads(reference.arguments) if (reference.arguments or "").strip() else {}
    if not isinstance(args, dict):
        raise Unjudgeable(f"the reference's arguments of {reference.name} are not an object")
    props = doc["parameters"]["properties"]
    missing = [k for k in doc["parameters"]["required"] if k not in args]
    if missing:
        raise Unjudgeable(f"the reference leaves out {reference.name}'s required {missing}")
    answer = {}
    for key, value in args.items():
        if key not in props:
            raise Unjudgeable(f"the reference passes {key!r}, which {reference.name} does not describe")
        answer[key] = [_answer_value(value, props[key]["type"])]
    for key, prop in props.items():
        if key not in args:
            answer[key] = ([_answer_value(prop["default"], prop["type"])] if "default" in prop else []) + [""]
    return {reference.name: answer}


def check(calls: list[ToolCall], tools: list[ToolSpec], reference: ToolCall | list[ToolCall]) -> tuple[bool, str]:
    """(right, why not) for a rollout's calls on a task written from `reference`: one call of one of `tools`, or
    several in one answer (BFCL's parallel checker: each reference call matched by one call, in any order, and no
    call left over)."""
    refs = [reference] if isinstance(reference, ToolCall) else list(reference)
    docs = {}
    for ref in refs:
        spec = next((t for t in tools if t.function.name == ref.name), None)
        if spec is None:
            raise Unjudgeable(f"the reference calls {ref.name!r}, which is not among the tools")
        docs.setdefault(ref.name, bfcl_doc(spec))
    answers = [possible_answer(ref, docs[ref.name]) for ref in refs]
    return run_checker(list(docs.values()), calls, answers, "simple" if len(refs) == 1 else "parallel")
