"""Lifecycles as data, and what is live: the contracts the actors, serve and the CLI share.

Weights versions (DESIGN.md "Weights lifecycle"): states, the one transitions table, and the one
function that enforces it.

    staged -> evaluating -> canary -> live -> retired
                         -> live            (no canary configured, or forced by an operator)
              evaluating -> rejected        (the held-out gate)
    staged -> superseded                    (a newer candidate was staged before this one was evaluated)
    canary -> rolled_back | retired         (canary feedback worse than live | replaced)
    live   -> rolled_back | retired         (live feedback dropped | a newer version went live)

Every change is published as an `evo.weights_status` event by the broadcaster.

Synthetic tasks (the questioner; every change is an `evo.task_status` event):

    proposed -> verified -> active -> retired
    proposed -> rejected                    (a duplicate, infeasible or unverifiable task)
    active   -> active                      (issued again)

`LivePointer` is the typed LIVE pointer (policies/engines/live_policy.py writes and follows it; on the bus it is a key in
a JetStream key-value bucket, policies/weights/live_board.py).
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, Field


class WeightsState(StrEnum):
    STAGED = "staged"
    EVALUATING = "evaluating"
    PASSED = "passed"  # passed its gate against the running canary; the canary after it
    CANARY = "canary"
    LIVE = "live"
    RETIRED = "retired"
    REJECTED = "rejected"
    SUPERSEDED = "superseded"
    ROLLED_BACK = "rolled_back"


S = WeightsState
TRANSITIONS: dict[WeightsState, frozenset[WeightsState]] = {
    S.STAGED: frozenset({S.EVALUATING, S.SUPERSEDED, S.LIVE}),  # -> live only when forced
    S.EVALUATING: frozenset({S.CANARY, S.LIVE, S.REJECTED, S.PASSED, S.STAGED}),  # staged: a gate cut by a restart
    S.PASSED: frozenset({S.CANARY, S.SUPERSEDED, S.LIVE}),  # superseded: the canary it passed against rolled back
    S.CANARY: frozenset({S.LIVE, S.ROLLED_BACK, S.RETIRED}),
    S.LIVE: frozenset({S.RETIRED, S.ROLLED_BACK}),
    S.RETIRED: frozenset({S.LIVE}),  # a rollback makes the predecessor live again
    S.REJECTED: frozenset({S.LIVE}),  # an operator may force a rejected version live
    S.SUPERSEDED: frozenset({S.LIVE}),
    S.ROLLED_BACK: frozenset({S.LIVE}),
}
TERMINAL_FOR_GATE = frozenset({S.REJECTED, S.SUPERSEDED, S.ROLLED_BACK, S.RETIRED})


class IllegalTransition(ValueError):
    pass


def _check(table: dict, first: tuple, what: str, current, new):
    """One state change against `table`; `current` None means a new item, which may only enter at `first`."""
    new = type(first[0])(new)
    if current is None:
        if new in first:
            return new
        raise IllegalTransition(f"a new {what} can only be {' or '.join(first)}, not {new}")
    current = type(first[0])(current)
    if new not in table[current]:
        raise IllegalTransition(f"{current} -> {new} is not a {what} lifecycle transition")
    return new


def transition(current: WeightsState | str | None, new: WeightsState | str) -> WeightsState:
    """Check one weights version's state change; a new version may only be staged, or be the base model going
    live. Returns the new state; raises IllegalTransition otherwise."""
    return _check(TRANSITIONS, (S.STAGED, S.LIVE), "weights version", current, new)


class TaskState(StrEnum):
    PROPOSED = "proposed"
    VERIFIED = "verified"
    REJECTED = "rejected"
    ACTIVE = "active"
    RETIRED = "retired"


T = TaskState
TASK_TRANSITIONS: dict[TaskState, frozenset[TaskState]] = {
    T.PROPOSED: frozenset({T.VERIFIED, T.REJECTED}),
    T.VERIFIED: frozenset({T.ACTIVE}),
    T.ACTIVE: frozenset({T.ACTIVE, T.RETIRED}),
    T.REJECTED: frozenset(),
    T.RETIRED: frozenset(),
}


def task_transition(current: TaskState | str | None, new: TaskState | str) -> TaskState:
    """Check one change of a synthetic task; a new task may only be proposed."""
    return _check(TASK_TRANSITIONS, (T.PROPOSED,), "synthetic task", current, new)


class CanaryRef(BaseModel):
    version: str
    path: str | None = None
    sha256: str | None = None
    share: float = Field(0.0, ge=0.0, le=1.0)
    stat: list[int] | None = Field(None, description="[size, mtime_ns] of the file when its sha256 matched")


class LivePointer(BaseModel):
    """What every replica must serve: the live version and, during a canary, the candidate answering `share`
    of the requests. Versions are named; `path` is where the broadcaster's node has the file (None with the base
    version: the base model folder's weights), and each node resolves a version to its own file
    (`LivePolicy.file`). `stat` pins the size and mtime of that file when its sha256 matched."""

    version: str
    path: str | None = None
    sha256: str | None = None
    stat: list[int] | None = None
    canary: CanaryRef | None = None
    at: float = 0.0
    shared: dict | None = Field(
        None,
        description="a SharedRef (policies/weights/shared.py): where the weights of "
        "one version named here can be copied from memory instead of the file",
    )

    def shared_for(self, version: str) -> dict | None:
        """The SharedRef when it holds `version` (else the version comes from its file)."""
        return self.shared if self.shared and self.shared.get("version") == version else None
