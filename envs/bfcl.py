"""BFCL v3 multi-turn from `bfcl-eval`, driven safely.

Data and the eight executable backends come from bfcl-eval (installed --no-deps). Calls are
parsed (`envs.tool_calls`) and dispatched to public backend methods on an allow-list, with
arguments bound against the method signature: model text is never eval'd. Ground-truth call
strings go through the same parser. Scoring follows BFCL's own checker per turn (state match of
every backend instance and the response subsequence check); the per-step signal says whether a
call executed and matched a ground-truth call of the current turn.
"""

from __future__ import annotations

import copy
import json

from actors.events import ChatMessage, ToolCall, ToolSpec
from envs.base import Reference, Split, StepResult, split_of
from envs.bfcl_backends import CATEGORIES, CLASSES, Backends, func_docs, load_category, to_tool_spec  # noqa: F401
from envs.tool_calls import CallError, ParsedCall, parse_json_call, parse_python_call

SYSTEM = (
    "You are an assistant that completes the user's request by calling the available functions. "
    "Call one or more functions when an action is needed; when the request is done, answer briefly in text."
)


class BfclEpisode:
    def __init__(
        self, entry: dict, truth: list[list[str]], category: str, max_turns: int, max_steps: int, max_obs_chars: int = 800
    ):
        self.entry_id = entry["id"]
        self.entry, self.category = entry, category
        self.turns = entry["question"][:max_turns]
        self.truth = truth[: len(self.turns)]
        self.max_steps, self.max_obs_chars = max_steps, max_obs_chars
        long_context = category == "long_context"
        self.missed = {int(k): set(v) for k, v in (entry.get("missed_function") or {}).items()}
        self._withheld = set().union(*self.missed.values()) if self.missed else set()
        excluded = set(entry.get("excluded_function", []))
        classes = entry["involved_classes"]
        self.model = Backends(classes, entry["initial_config"], long_context, excluded)
        self.ground = Backends(classes, entry["initial_config"], long_context, excluded)
        self._docs = [d for c in classes for d in func_docs(c) if d["name"] not in excluded]
        self.turn = -1
        self.steps_in_turn = 0
        self.model_results: list[str] = []  # all turns, as BFCL's response checker expects
        self.turn_results: list[float] = []
        self._gt_calls: list[ParsedCall] = []
        self._gt_results: list[str] = []
        self.system_prompt = SYSTEM

    @property
    def tools(self) -> list[ToolSpec]:
        hidden = set().union(*(names for t, names in self.missed.items() if t > self.turn)) if self.missed else set()
        return [to_tool_spec(d) for d in self._docs if d["name"] not in hidden]

    def next_user_message(self) -> str | None:
        if self.turn >= 0:
            self.end_turn()
        self.turn += 1
        self.steps_in_turn = 0
        if self.turn >= len(self.turns):
            return None
        self._gt_calls = [parse_python_call(s) for s in self.truth[self.turn]]
        self._gt_results = [self.ground.call(c) for c in self._gt_calls]
        msgs = self.turns[self.turn]
        text = "\n".join(m["content"] for m in msgs if m.get("role") == "user")
        if self.turn in self.missed and not text:
            text = "The functions you needed are available now; please continue."
        return text

    def _parse(self, action: ChatMessage) -> list[ParsedCall | CallError]:
        out: list[ParsedCall | CallError] = []
        for tc in action.tool_calls:
            try:
                out.append(parse_json_call(tc.name, tc.arguments))
            except CallError as exc:
                out.append(exc)
        return out

    def step(self, action: ChatMessage) -> StepResult:
        self.steps_in_turn += 1
        if not action.tool_calls:
            # a text answer closes the turn; it is a good step only when nothing was left to do
            remaining = self._remaining_gt()
            return StepResult([], 0.5 if not remaining else -0.5, True)
        observations, errors, signals = [], [], []
        for tc, parsed in zip(action.tool_calls, self._parse(action)):
            if isinstance(parsed, CallError):
                result, sig = f"Error: {parsed}", -1.0
                errors.append(str(parsed))
            else:
                try:
                    result = self.model.call(parsed)
                    self.model_results.append(result)
                    sig = self._call_signal(parsed, result)
                except CallError as exc:  # a known function with bad arguments is closer than an invented one
                    result, sig = f"Error: {exc}", (-0.6 if parsed.name in self.model.methods else -1.0)
                    errors.append(str(exc))
            signals.append(sig)
            observations.append(ChatMessage(role="tool", tool_call_id=tc.id, content=result[: self.max_obs_chars]))
        done = self.steps_in_turn >= self.max_steps
        return StepResult(observations, sum(signals) / len(signals), done, errors)

    def _call_signal(self, call: ParsedCall, result: str) -> float:
        if result.startswith("Error during execution") or '"error"' in result[:40].lower():
            return -0.5
        for gt in self._gt_calls:
            if gt.name == call.name and _same_args(gt, call):
                return 1.0
        return 0.3 if any(gt.name == call.name for gt in self._gt_calls) else -0.2

    def _remaining_gt(self) -> list[str]:
        pending = list(self._gt_results)
        for r in self.model_results:
            if r in pending:
                pending.remove(r)
        return pending

    def end_turn(self) -> None:
        if self.turn < 0 or self.turn >= len(self.turns) or len(self.turn_results) > self.turn:
            return
        from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import response_checker, state_checker

        state_ok = state_checker(self.model.instances, self.ground.instances)["valid"]
        resp_ok = response_checker(self.model_results, self._gt_results, self.turn)["valid"]
        if state_ok and resp_ok:
            score = 1.0
        else:
            # partial credit keeps GRPO groups informative for a weak policy: share of ground-truth
            # calls whose function the model also called successfully this turn (max 0.5)
            called = [r for r in self.model_results]
            hits = sum(1 for r in self._gt_results if r in called)
            score = 0.5 * hits / max(1, len(self._gt_results)) if self._gt_results else 0.0
        self.turn_results.append(score)

    _STATE = ("turn", "steps_in_turn", "model_results", "turn_results", "_gt_calls", "_gt_results")

    def snapshot(self) -> dict:
        """Deep copy of everything that changes: both backend sets and the turn bookkeeping."""
        return copy.deepcopy(
            {"model": self.model.instances, "ground": self.ground.instances, **{k: getattr(self, k) for k in self._STATE}}
        )

    def restore(self, snap: dict) -> None:
        snap = copy.deepcopy(snap)
        for side in ("model", "ground"):
            backends = getattr(self, side)
            backends.instances = snap[side]
            for name in list(backends.methods):
                for inst in backends.instances.values():
                    if hasattr(inst, name):
                        backends.methods[name] = getattr(inst, name)
        for k in self._STATE:
            setattr(self, k, snap[k])

    def outcome(self) -> float:
        self.end_turn()
        return sum(self.turn_results) / len(self.turns) if self.turns else 0.0

    def passed(self) -> bool:
        self.end_turn()
        return bool(self.turn_results) and all(r == 1.0 for r in self.turn_results)


def _same_args(a: ParsedCall, b: ParsedCall) -> bool:
    if a.kwargs and b.kwargs:
        return all(b.kwargs.get(k) == v for k, v in a.kwargs.items())
    return (tuple(a.args) + tuple(a.kwargs.values())) == (tuple(b.args) + tuple(b.kwargs.values()))


class BfclEnvironment:
    """All entries of the configured categories; split fixed by entry-id hash."""

    name = "bfcl"

    def __init__(
        self,
        categories=("base",),
        classes=None,
        max_turns: int = 4,
        max_steps_per_turn: int = 4,
        heldout_fraction: float = 0.2,
        max_observation_chars: int = 800,
    ):
        self.categories = tuple(categories)
        self.classes = set(classes) if classes else None
        self.max_turns, self.max_steps = max_turns, max_steps_per_turn
        self.heldout_fraction, self.max_obs = heldout_fraction, max_observation_chars
        self._index: dict[str, str] = {}
        for cat in self.categories:
            entries, _ = load_category(cat)
            for eid, e in entries.items():
                if self.classes is None or set(e["involved_classes"]) <= self.classes:
                    self._index[eid] = cat

    @classmethod
    def from_settings(cls, env) -> "BfclEnvironment":
        return cls(
            env.bfcl_categories,
            env.bfcl_classes,
            env.max_turns,
            env.max_steps_per_turn,
            env.heldout_fraction,
            env.max_observation_chars,
        )

    def entries(self, split: Split) -> list[str]:
        return sorted(e for e in self._index if split_of(e, self.heldout_fraction) == split)

    def episode(self, entry_id: str, spec: dict | None = None) -> BfclEpisode:
        """An episode of a dataset entry, or of a synthetic task when `spec` is given.

        A synthetic task (`spec` = {"base_entry_id", "query", "reference"}) starts from its base
        entry's initial state and functions; its one turn is `query` and its ground truth is the
        `reference` call list, so BFCL's own state and response checkers score it."""
        if spec is not None:
            return self._synthetic(entry_id, spec)
        cat = self._index.get(entry_id)
        if cat is None:
            raise KeyError(f"unknown BFCL entry {entry_id!r}")
        entries, truths = load_category(cat)
        return BfclEpisode(entries[entry_id], truths[entry_id], cat, self.max_turns, self.max_steps, self.max_obs)

    def _synthetic(self, entry_id: str, spec: dict) -> BfclEpisode:
        base_id = spec.get("base_entry_id")
        cat = self._index.get(base_id)
        if cat is None:
            raise KeyError(f"synthetic task {entry_id!r} names unknown base entry {base_id!r}")
        query, reference = str(spec.get("query") or ""), list(spec.get("reference") or [])
        if not query.strip() or not reference:
            raise ValueError(f"synthetic task {entry_id!r} needs a query and a reference solution")
        for call in reference:
            parse_python_call(call)  # raises CallError on anything that is not a plain call
        base = load_category(cat)[0][base_id]
        entry = {
            "id": entry_id,
            "question": [[{"role": "user", "content": query}]],
            "initial_config": base["initial_config"],
            "involved_classes": base["involved_classes"],
            "excluded_function": base.get("excluded_function", []),
        }
        return BfclEpisode(entry, [reference], cat, 1, self.max_steps, self.max_obs)

    def category_of(self, entry_id: str) -> str:
        return self._index[entry_id]

    def reference_action(self, entry_id: str) -> Reference | None:
        """The first ground-truth call of the first turn (None when that turn needs no call or uses
        positional arguments)."""
        ep = self.episode(entry_id)
        user = ep.next_user_message()
        truth = ep.truth[0] if ep.truth else []
        if not user or not truth:
            return None
        call = parse_python_call(truth[0])
        if call.args:
            return None
        action = ChatMessage(role="assistant", tool_calls=[ToolCall(id="ref", name=call.name, arguments=json.dumps(call.kwargs))])
        return Reference(
            [ChatMessage(role="system", content=ep.system_prompt), ChatMessage(role="user", content=user)], ep.tools, action
        )

    def reference_solution(self, entry_id: str, spec: dict | None = None) -> list[list[ChatMessage]] | None:
        """A known-good trajectory, per turn: the ground-truth calls of the turn in one action (a synthetic
        task's reference calls), then a short text answer. None when a call uses positional arguments
        (they have no JSON form)."""
        ep = self.episode(entry_id, spec)
        turns = []
        for k, calls in enumerate(ep.truth[: len(ep.turns)]):
            parsed = [parse_python_call(c) for c in calls]
            if any(c.args for c in parsed):
                return None
            actions = []
            if parsed:
                actions.append(
                    ChatMessage(
                        role="assistant",
                        tool_calls=[
                            ToolCall(id=f"ref-{k}-{i}", name=c.name, arguments=json.dumps(c.kwargs)) for i, c in enumerate(parsed)
                        ],
                    )
                )
            actions.append(ChatMessage(role="assistant", content="Done."))
            turns.append(actions)
        return turns

    def query_of(self, entry_id: str) -> str:
        entries, _ = load_category(self._index[entry_id])
        return entries[entry_id]["question"][0][0]["content"]

    def probe(self, base_entry_id: str) -> "Probe":
        """Fresh backends of a train entry's initial state, for exploration (no task, no scoring)."""
        return Probe(self.episode(base_entry_id))


class Probe:
    """Free exploration of an entry's functions: `call()` executes one parsed call, safely."""

    def __init__(self, ep: BfclEpisode):
        self.tools = [to_tool_spec(d) for d in ep._docs]
        self.description = "Functions of " + ", ".join(ep.entry["involved_classes"])
        self._backends = ep.model

    def call(self, name: str, arguments: str) -> tuple[str, bool, str]:
        """(python call string, ok, result); never raises on model input."""
        try:
            parsed = parse_json_call(name, arguments)
            result = self._backends.call(parsed)
        except CallError as exc:
            return f"{name}(...)", False, f"Error: {exc}"
        text = call_string(parsed)
        ok = not (result.startswith("Error") or '"error"' in result[:40].lower())
        return text, ok, result


def call_string(call: ParsedCall) -> str:
    """BFCL's ground-truth form, `name(k=v, ...)` with Python literals (parsed back by `ast`)."""
    parts = [repr(a) for a in call.args] + [f"{k}={v!r}" for k, v in call.kwargs.items()]
    return f"{call.name}({', '.join(parts)})"
