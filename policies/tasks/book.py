"""The questioner's book of synthetic tasks: typed records whose status changes only through the task
lifecycle table (`actors/lifecycles.py`), and the band rule that decides when a task retires.

A record is what the questioner persists between restarts; every status change is also an
`evo.task_status` event (`status_event`), so the stream holds the full history and the file only the
recent one.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, Field

from actors.events import derived_id
from actors.lifecycles import TaskState, task_transition
from actors.task_events import TaskStatus
from policies.learning.adca import self_consistency

KEEP_DONE = 500  # rejected / retired records kept in the file


class SyntheticTask(BaseModel):
    task_id: str
    env: str
    entry: str = Field(description="the synthetic entry id the explorer episodes start from")
    base: str = Field(description="the train entry it was written from")
    query: str
    reference: list[str]
    synthesizer: str = ""
    sig: str = ""
    exploration: list[str] = []
    tools: list[dict] = Field([], description="the declared tools of a task on the clients' tools (env client_tools)")
    status: TaskState | None = None  # None until proposed
    issued: int = 0
    due: bool = False
    judged: int = 0
    consistency: float | None = None


def status_event_id(task_id: str, status: str, n: int = 0) -> str:
    return derived_id("task_status", f"{task_id}:{status}:{n}")


def band_decision(outcomes: list[float], low: float, high: float) -> tuple[float, str | None]:
    """(self-consistency, retirement reason or None to keep the task active)."""
    p = self_consistency(outcomes)
    if p < low or p > high:
        wins = sum(o >= 0.5 for o in outcomes)
        return p, (
            "too easy: the group agrees it succeeds" if wins * 2 > len(outcomes) else "too hard: the group agrees it fails"
        ) + f" (consistency {p:.2f})"
    return p, None


class TaskBook:
    def __init__(self, records: dict | None = None):
        self.tasks: dict[str, SyntheticTask] = {t: SyntheticTask.model_validate(r) for t, r in (records or {}).items()}

    def get(self, task_id: str) -> SyntheticTask | None:
        return self.tasks.get(task_id)

    def move(self, rec: SyntheticTask, new: TaskState, reason: str) -> TaskStatus:
        """Change a task's status (IllegalTransition if the table forbids it); returns the event to publish."""
        rec.status = task_transition(rec.status, new)
        self.tasks[rec.task_id] = rec
        n = rec.issued if new == TaskState.ACTIVE else 0
        return TaskStatus(
            event_id=status_event_id(rec.task_id, new, n),
            task_id=rec.task_id,
            status=new,
            reason=reason,
            env=rec.env,
            query=rec.query,
            reference=rec.reference,
            base_entry_id=rec.base,
            consistency=rec.consistency,
            synthesizer=rec.synthesizer,
            exploration=rec.exploration if new == TaskState.PROPOSED else [],
        )

    def next_due(self) -> str | None:
        """A verified task not issued yet, or an active one due again."""
        return next(
            (t for t, r in self.tasks.items() if r.status == TaskState.VERIFIED or (r.status == TaskState.ACTIVE and r.due)), None
        )

    def dump(self) -> dict:
        done = [t for t, r in self.tasks.items() if r.status in (TaskState.REJECTED, TaskState.RETIRED)]
        for t in done[: max(0, len(done) - KEEP_DONE)]:  # the stream keeps the history; the file keeps recent ones
            del self.tasks[t]
        return {t: r.model_dump(mode="json") for t, r in self.tasks.items()}

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.tasks.values():
            out[str(r.status)] = out.get(str(r.status), 0) + 1
        return out


def record_exploration(path: Path, row: dict) -> None:
    """Every exploration is kept (JSON lines in the state dir; the file rolls over at 20 MB)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.stat().st_size > 20_000_000:
        path.replace(path.with_suffix(".jsonl.1"))
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")
