"""Parsing untrusted tool calls into (name, positional args, keyword args) without eval.

Accepts the OpenAI JSON form ({"name", "arguments"}) and Python call syntax (`cd(folder='x')`),
the latter parsed with `ast` and only literal arguments accepted (ast.literal_eval per node).
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass

MAX_CALL_CHARS = 20_000
_LITERALS = (str, int, float, bool, type(None), list, dict, tuple)


class CallError(ValueError):
    """A call that cannot be executed; its message goes back to the model."""


@dataclass
class ParsedCall:
    name: str
    args: tuple
    kwargs: dict


def _check_value(v, depth: int = 0):
    if depth > 8:
        raise CallError("argument nesting too deep")
    if not isinstance(v, _LITERALS):
        raise CallError(f"unsupported argument type {type(v).__name__}")
    if isinstance(v, (list, tuple)):
        for x in v:
            _check_value(x, depth + 1)
    if isinstance(v, dict):
        for k, x in v.items():
            if not isinstance(k, str):
                raise CallError("object keys must be strings")
            _check_value(x, depth + 1)


def parse_python_call(text: str) -> ParsedCall:
    if len(text) > MAX_CALL_CHARS:
        raise CallError(f"call is {len(text)} characters; the limit is {MAX_CALL_CHARS}")
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as exc:
        raise CallError(f"not a function call: {exc.msg}") from None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise CallError("expected a call of a plain function name, like name(arg=value)")
    try:
        args = tuple(ast.literal_eval(a) for a in node.args)
        kwargs = {}
        for kw in node.keywords:
            if kw.arg is None:
                raise CallError("**kwargs are not allowed")
            kwargs[kw.arg] = ast.literal_eval(kw.value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise CallError("arguments must be literals (strings, numbers, lists, dicts)") from None
    for v in (*args, *kwargs.values()):
        _check_value(v)
    return ParsedCall(node.func.id, args, kwargs)


def parse_json_call(name: str, arguments: str | dict) -> ParsedCall:
    if not isinstance(name, str) or not name.isidentifier():
        raise CallError(f"invalid function name {str(name)[:60]!r}")
    if isinstance(arguments, str):
        if len(arguments) > MAX_CALL_CHARS:
            raise CallError(f"arguments are {len(arguments)} characters; the limit is {MAX_CALL_CHARS}")
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            raise CallError(f"arguments are not valid JSON: {exc.msg}") from None
    if not isinstance(arguments, dict):
        raise CallError("arguments must be a JSON object")
    for v in arguments.values():
        _check_value(v)
    return ParsedCall(name, (), dict(arguments))
