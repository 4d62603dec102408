"""BFCL v3's data files and executable backends (from `bfcl-eval`, installed --no-deps).

`load_category` reads a category's entries and ground truth; `to_tool_spec` turns a function doc into
an OpenAI tool; `Backends` holds one episode's backend instances and dispatches parsed calls to
public backend methods on an allow-list, with arguments bound against the method signature: model
text is never eval'd.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import inspect
import json
from functools import lru_cache
from pathlib import Path

from actors.events import ToolSpec
from envs.tool_calls import CallError, ParsedCall

CATEGORIES = ("base", "miss_func", "miss_param", "long_context")
CLASSES = (
    "GorillaFileSystem",
    "MathAPI",
    "MessageAPI",
    "TwitterAPI",
    "TicketAPI",
    "TradingBot",
    "TravelAPI",
    "VehicleControlAPI",
)


def _root() -> Path:
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None:
        raise RuntimeError("bfcl-eval is not installed (pip install --no-deps bfcl-eval)")
    return Path(spec.submodule_search_locations[0])


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def load_data(name: str) -> tuple[dict, dict]:
    """entries and ground truths by id of one BFCL data file (e.g. `BFCL_v4_simple_python.json`)."""
    entries = {e["id"]: e for e in _jsonl(_root() / "data" / name)}
    truths = {g["id"]: g["ground_truth"] for g in _jsonl(_root() / "data" / "possible_answer" / name)}
    return entries, truths


@lru_cache(maxsize=None)
def load_category(category: str) -> tuple[dict, dict]:
    """entries and ground truths by id for one multi-turn category."""
    if category not in CATEGORIES:
        raise ValueError(f"unknown BFCL category {category!r}; known: {CATEGORIES}")
    return load_data(f"BFCL_v4_multi_turn_{category}.json")


@lru_cache(maxsize=None)
def func_docs(class_name: str) -> tuple[dict, ...]:
    from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING as M

    return tuple(_jsonl(_root() / "data" / "multi_turn_func_doc" / M[class_name]))


_TYPES = {
    "dict": "object",
    "float": "number",
    "int": "integer",
    "tuple": "array",
    "list": "array",
    "string": "string",
    "str": "string",
    "boolean": "boolean",
    "bool": "boolean",
    "any": "string",
}


def _openai_schema(node: dict) -> dict:
    out = {k: v for k, v in node.items() if k not in ("type", "properties", "items", "response")}
    if "type" in node:
        out["type"] = _TYPES.get(node["type"], node["type"])
    if "properties" in node:
        out["properties"] = {k: _openai_schema(v) for k, v in node["properties"].items()}
    if "items" in node:
        out["items"] = _openai_schema(node["items"])
    return out


def to_tool_spec(doc: dict) -> ToolSpec:
    desc = doc.get("description", "")
    desc = desc.split("Tool description: ", 1)[-1]
    return ToolSpec(
        function={
            "name": doc["name"],
            "description": desc,
            "parameters": _openai_schema(doc.get("parameters", {"type": "dict", "properties": {}})),
        }
    )


def _instantiate(class_name: str, config: dict, long_context: bool):
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING, STATELESS_CLASSES

    cls = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[class_name]), class_name)
    inst = cls()
    if class_name not in STATELESS_CLASSES:
        inst._load_scenario(copy.deepcopy(config.get(class_name, {})), long_context=long_context)
    return inst


def _stringify(result) -> str:
    if isinstance(result, str):
        return result
    if isinstance(result, dict):
        try:
            return json.dumps(result)
        except (TypeError, ValueError):
            return str(result)
    return str(result)


class Backends:
    """Backend instances of one episode with an allow-listed method table."""

    def __init__(self, classes: list[str], config: dict, long_context: bool, excluded: set[str]):
        self.instances = {c: _instantiate(c, config, long_context) for c in classes}
        self.methods: dict[str, object] = {}
        for inst in self.instances.values():
            cls_names = {d["name"] for d in func_docs(type(inst).__name__)}
            for name, fn in inspect.getmembers(inst, predicate=inspect.ismethod):
                if not name.startswith("_") and name in cls_names and name not in excluded:
                    self.methods[name] = fn

    def call(self, call: ParsedCall) -> str:
        fn = self.methods.get(call.name)
        if fn is None:
            raise CallError(f"unknown function {call.name!r}")
        try:
            inspect.signature(fn).bind(*call.args, **call.kwargs)
        except TypeError as exc:
            raise CallError(f"bad arguments for {call.name}: {exc}") from None
        try:
            return _stringify(fn(*call.args, **call.kwargs))
        except Exception as exc:  # a backend raising on odd input is the model's error, not ours
            return f"Error during execution: {exc}"
