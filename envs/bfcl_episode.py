"""One BFCL v3 multi-turn episode: the user's turns in order, the model's calls parsed and run on the entry's
backends, and beside them the ground truth run on a second copy. A turn passes when BFCL's checker finds every
backend instance in the same state and the ground truth's responses in the model's (`BfclEpisode.end_turn`); each
step's signal says whether its calls executed and matched a ground-truth call of the current turn.
"""

from __future__ import annotations

import copy

from actors.events import ChatMessage, ToolSpec
from envs.base import StepResult
from envs.bfcl_backends import Backends, func_docs, to_tool_spec
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
