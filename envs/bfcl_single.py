"""BFCL v4 single-turn function calling (simple_python, multiple, parallel) from `bfcl-eval`, checked by BFCL's own
AST checker.

Each entry is one user request with the functions it may call; the episode is one action: the calls the model
makes (as OpenAI tool calls) are turned into BFCL's model-output form (`[{name: {param: value}}]`) and checked
against the entry's possible answers by `bfcl_eval.eval_checker.ast_eval.ast_checker` (types, required and
optional parameters, accepted values, order-free for parallel). Nothing the model writes is executed: the
checker compares values. Outcome 1.0 when the checker accepts, else 0.0; the step's signal is +1 accepted,
-0.5 a call it rejects (with its reason as the error), -1 no call at all. The train / held-out split is the usual
entry-id hash.

BFCL's checker module imports `bfcl_eval.constants.model_config`, which imports every vendor's API client, only
to ask whether a model's function names had their dots escaped. `ast_checker()` loads the checker with a stand-in
for that one module (no escaping: our tool names keep their dots), and the real module is left untouched.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from functools import lru_cache

from actors.events import ChatMessage, ToolCall, ToolSpec
from envs.base import Reference, Split, StepResult, split_of
from envs.bfcl_backends import _root, load_data, to_tool_spec

CATEGORIES = ("simple_python", "multiple", "parallel")
SYSTEM = (
    "You are an assistant that answers the user's request by calling the available functions with the right "
    "arguments. Call every function the request needs, in one message."
)


@lru_cache(maxsize=1)
def ast_checker():
    """BFCL's `ast_checker` function, its `Language` enum: loaded without the vendor clients (module docstring)."""
    stand_in = types.ModuleType("bfcl_eval.constants.model_config")

    class _NoEscaping(dict):
        def __missing__(self, key):
            return types.SimpleNamespace(underscore_to_dot=False)

    stand_in.MODEL_CONFIG_MAPPING = _NoEscaping()
    name = "bfcl_eval.constants.model_config"
    real = sys.modules.get(name)
    sys.modules[name] = stand_in
    try:
        spec = importlib.util.spec_from_file_location(
            "kaizen_bfcl_ast_checker", _root() / "eval_checker" / "ast_eval" / "ast_checker.py"
        )
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        if real is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = real
    from bfcl_eval.constants.enums import Language

    return mod.ast_checker, Language.PYTHON


@lru_cache(maxsize=None)
def load(category: str) -> tuple[dict, dict]:
    """entries and possible answers by id for one single-turn category."""
    if category not in CATEGORIES:
        raise ValueError(f"unknown BFCL single-turn category {category!r}; known: {CATEGORIES}")
    return load_data(f"BFCL_v4_{category}.json")


def category_of(entry_id: str) -> str:
    return next(c for c in CATEGORIES if entry_id.startswith(c + "_"))


def run_checker(docs: list[dict], calls: list[ToolCall], answers: list[dict], category: str) -> tuple[bool, str]:
    """(accepted, why not) for the calls a model made, by BFCL's AST checker: `docs` are BFCL function docs,
    `answers` its possible answers, `category` says which of its checkers (simple, multiple, parallel)."""
    output = []
    for tc in calls:
        try:
            args = json.loads(tc.arguments) if tc.arguments.strip() else {}
        except json.JSONDecodeError as exc:
            return False, f"arguments of {tc.name} are not valid JSON: {exc.msg}"
        if not isinstance(args, dict):
            return False, f"arguments of {tc.name} are not an object"
        output.append({tc.name: args})
    checker, python = ast_checker()
    try:
        res = checker(docs, output, answers, python, category, "kaizen")
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:  # odd output shapes are the model's
        return False, f"the checker rejected the calls: {type(exc).__name__}: {str(exc)[:200]}"
    return bool(res.get("valid")), "; ".join(map(str, res.get("error", [])))[:500]


def check(entry_id: str, calls: list[ToolCall]) -> tuple[bool, str]:
    """(accepted, why not) for the calls a model made on an entry, by BFCL's AST checker."""
    entries, answers = load(category_of(entry_id))
    return run_checker(entries[entry_id]["function"], calls, answers[entry_id], category_of(entry_id))


class OneCallEpisode:
    """One request, one action: its calls accepted (+1, outcome 1.0), rejected (-0.5, with the checker's reason) or
    none at all (-1). `judge(calls)` says which."""

    system_prompt = SYSTEM

    def __init__(self, entry_id: str, question: str, tools: list[ToolSpec]):
        self.entry_id, self.question, self.tools = entry_id, question, tools
        self.turn, self.score, self.error = -1, None, ""

    def judge(self, calls: list[ToolCall]) -> tuple[bool, str]:
        raise NotImplementedError

    def next_user_message(self) -> str | None:
        self.turn += 1
        return self.question if self.turn == 0 else None

    def step(self, action: ChatMessage) -> StepResult:
        if not action.tool_calls:
            self.score, self.error = 0.0, "no function call"
            return StepResult([], -1.0, True, [self.error])
        ok, why = self.judge(action.tool_calls)
        self.score, self.error = (1.0 if ok else 0.0), ("" if ok else why)
        return StepResult([], 1.0 if ok else -0.5, True, [] if ok else [why])

    def passed(self) -> bool:
        return self.score == 1.0

    def end_turn(self) -> None:
        pass

    def snapshot(self) -> dict:
        return {"turn": self.turn, "score": self.score}

    def restore(self, snap: dict) -> None:
        self.turn, self.score = snap["turn"], snap["score"]

    def outcome(self) -> float:
        return self.score or 0.0


class SingleTurnEpisode(OneCallEpisode):
    def __init__(self, entry: dict):
        super().__init__(entry["id"], entry["question"][0][-1]["content"], [to_tool_spec(d) for d in entry["function"]])
        self.category = category_of(entry["id"])

    def judge(self, calls: list[ToolCall]) -> tuple[bool, str]:
        return check(self.entry_id, calls)


def reference_calls(entry_id: str) -> list[ToolCall]:
    """One accepted answer: each ground-truth call with the first accepted value of every parameter it names
    (an optional parameter whose accepted values start with "" is left out)."""
    _, answers = load(category_of(entry_id))
    calls = []
    for i, call in enumerate(answers[entry_id]):
        ((name, params),) = call.items()
        args = {k: v[0] for k, v in params.items() if v and v[0] != ""}
        calls.append(ToolCall(id=f"ref-{i}", name=name, arguments=json.dumps(args)))
    return calls


class SingleTurnEnvironment:
    name = "bfcl_single"

    def __init__(self, categories=CATEGORIES, heldout_fraction: float = 0.2):
        self.categories, self.heldout_fraction = tuple(categories), heldout_fraction
        self._entries = {eid: e for c in self.categories for eid, e in load(c)[0].items()}

    @classmethod
    def from_settings(cls, env) -> "SingleTurnEnvironment":
        return cls(categories=env.bfcl_single_categories, heldout_fraction=env.heldout_fraction)

    def entries(self, split: Split) -> list[str]:
        return sorted(e for e in self._entries if split_of(e, self.heldout_fraction) == split)

    def episode(self, entry_id: str, spec: dict | None = None) -> SingleTurnEpisode:
        if spec is not None:
            raise ValueError("bfcl_single has no synthetic tasks")
        if entry_id not in self._entries:
            raise KeyError(f"unknown bfcl_single entry {entry_id!r}")
        return SingleTurnEpisode(self._entries[entry_id])

    def category_of(self, entry_id: str) -> str:
        return category_of(entry_id)

    def level_of(self, entry_id: str) -> int:
        return CATEGORIES.index(category_of(entry_id))

    def query_of(self, entry_id: str) -> str:
        return self._entries[entry_id]["question"][0][-1]["content"]

    def reference_action(self, entry_id: str) -> Reference | None:
        """The first accepted answer as an action, when BFCL's checker accepts it (it does for 789 of the 800
        entries; the others' answers hold values that `reference_calls` cannot pick)."""
        calls = reference_calls(entry_id)
        if not check(entry_id, calls)[0]:
            return None
        ep = self.episode(entry_id)
        return Reference(
            [ChatMessage(role="system", content=ep.system_prompt), ChatMessage(role="user", content=ep.question)],
            ep.tools,
            ChatMessage(role="assistant", tool_calls=calls),
        )

    def reference_solution(self, entry_id: str, spec: dict | None = None) -> list[list[ChatMessage]] | None:
        ref = self.reference_action(entry_id)
        return [[ref.action]] if ref else None
