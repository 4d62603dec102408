"""BFCL v3 multi-turn from `bfcl-eval`, driven safely.

Data and the eight executable backends come from bfcl-eval (installed --no-deps). Calls are
parsed (`envs.tool_calls`) and dispatched to public backend methods on an allow-list, with
arguments bound against the method signature: model text is never eval'd. Ground-truth call
strings go through the same parser. Scoring follows BFCL's own checker per turn (state match of
every backend instance and the response subsequence check); the per-step signal says whether a
call executed and matched a ground-truth call of the current turn (`envs/bfcl_episode.py`).
"""

from __future__ import annotations

import json

from actors.events import ChatMessage, ToolCall
from envs.base import Reference, Split, split_of
from envs.bfcl_backends import CATEGORIES, CLASSES, Backends, func_docs, load_category, to_tool_spec  # noqa: F401
from envs.bfcl_episode import BfclEpisode
from envs.tool_calls import CallError, ParsedCall, parse_json_call, parse_python_call


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
