"""The environment contract: episodes driven by assistant messages, typed error observations.

An environment lists its task entries per split and starts an `Episode` for one entry. The
episode hands out user turns, executes one assistant action per `step()` and returns tool
observations plus a per-step signal; `outcome()` scores the whole episode in [0, 1]. Invalid
actions never raise: they come back as an error observation with a negative signal.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Literal, Protocol

from actors.events import ChatMessage, ToolSpec

Split = Literal["train", "heldout"]


def split_of(entry_id: str, heldout_fraction: float, seed: str = "kaizen-split-v1") -> Split:
    """Fixed split by hashing the entry id: stable across machines, releases and restarts."""
    h = int.from_bytes(hashlib.sha256(f"{seed}:{entry_id}".encode()).digest()[:8], "big")
    return "heldout" if (h % 10_000) < heldout_fraction * 10_000 else "train"


@dataclass
class Reference:
    """A known-good first action for an entry, in context: what the promotion gate scores by likelihood."""

    messages: list[ChatMessage]  # system + first user turn
    tools: list[ToolSpec]
    action: ChatMessage  # the reference assistant message


@dataclass
class StepResult:
    observations: list[ChatMessage]
    signal: float  # -1 (harmful / invalid) .. +1 (moved the state toward the goal)
    turn_done: bool  # the assistant answered in text, or ran out of steps
    errors: list[str] = field(default_factory=list)


class Episode(Protocol):
    entry_id: str
    tools: list[ToolSpec]
    system_prompt: str

    def next_user_message(self) -> str | None: ...

    def step(self, action: ChatMessage) -> StepResult: ...

    def end_turn(self) -> None: ...

    def outcome(self) -> float: ...

    def snapshot(self) -> object: ...

    def restore(self, snap: object) -> None: ...


def replay(env: "Environment", entry_id: str, turns: list[list[ChatMessage]], spec: dict | None = None) -> Episode:
    """A fresh episode with recorded actions re-applied, turn by turn (feasibility checks, debugging)."""
    ep = env.episode(entry_id, spec)
    for actions in turns:
        if ep.next_user_message() is None:
            break
        for action in actions:
            if ep.step(action).turn_done:
                break
    return ep


class Environment(Protocol):
    name: str

    def entries(self, split: Split) -> list[str]: ...

    def episode(self, entry_id: str, spec: dict | None = None) -> Episode: ...

    def query_of(self, entry_id: str) -> str: ...

    def category_of(self, entry_id: str) -> str: ...

    def reference_action(self, entry_id: str) -> Reference | None: ...
