"""The weights-version lifecycle as data: states, the one transitions table, and the one function
that enforces it (DESIGN.md "Weights lifecycle").

    staged -> evaluating -> canary -> live -> retired
                         -> live            (no canary configured, or forced by an operator)
              evaluating -> rejected        (the held-out gate)
    staged -> superseded                    (a newer candidate was staged before this one was evaluated)
    canary -> rolled_back | retired         (canary feedback worse than live | replaced)
    live   -> rolled_back | retired         (live feedback dropped | a newer version went live)

Every change is published as an `evo.weights_status` event by the broadcaster.
"""
from __future__ import annotations

from enum import StrEnum


class WeightsState(StrEnum):
    STAGED = "staged"
    EVALUATING = "evaluating"
    CANARY = "canary"
    LIVE = "live"
    RETIRED = "retired"
    REJECTED = "rejected"
    SUPERSEDED = "superseded"
    ROLLED_BACK = "rolled_back"


S = WeightsState
TRANSITIONS: dict[WeightsState, frozenset[WeightsState]] = {
    S.STAGED: frozenset({S.EVALUATING, S.SUPERSEDED, S.LIVE}),  # -> live only when forced
    S.EVALUATING: frozenset({S.CANARY, S.LIVE, S.REJECTED}),
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


def transition(current: WeightsState | str | None, new: WeightsState | str) -> WeightsState:
    """Check one state change; `current` None means the version is new (it may only be staged, or be
    the base model going live). Returns the new state; raises IllegalTransition otherwise."""
    new = WeightsState(new)
    if current is None:
        if new in (S.STAGED, S.LIVE):
            return new
        raise IllegalTransition(f"a new version can only be staged (or live), not {new}")
    current = WeightsState(current)
    if new not in TRANSITIONS[current]:
        raise IllegalTransition(f"{current} -> {new} is not a weights lifecycle transition")
    return new
