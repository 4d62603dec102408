"""The promotion lifecycle's types: a version's gate scores, the running canary, the passed successor
behind it, a gate's outcome, and the actions the broadcaster carries out (`policies/promotion/plan.py`
decides them, `PromotionBook.apply` records them, `actors/broadcaster.py` does what they ask of the
outside world).

Weights versions are named here; their one reference type is `actors.events.WeightsRef`, kept by the
book.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, model_serializer, model_validator


class GateScore(BaseModel):
    """A version's gate scores (`GateScores.view`): the per-token NLL of the reference actions, and
    where its greedy held-out episodes ran, the mean outcome per environment and their mean. On disk
    and in metrics it is the flat mapping it always was: `{"nll", "success_<env>", ..., "success"}`,
    each key present only when scored."""

    nll: float | None = None
    success: float | None = None  # None: only the likelihood was scored
    envs: dict[str, float] = {}

    @model_validator(mode="before")
    @classmethod
    def _from_flat(cls, data):
        if isinstance(data, dict) and "envs" not in data:
            envs = {k[len("success_") :]: v for k, v in data.items() if k.startswith("success_")}
            return {"nll": data.get("nll"), "success": data.get("success"), "envs": envs}
        return data

    @model_serializer
    def flat(self) -> dict[str, float]:
        out = {"nll": self.nll} if self.nll is not None else {}
        out.update({f"success_{e}": x for e, x in self.envs.items()})
        return out | ({"success": self.success} if self.success is not None else {})

    def success_or(self, default: float = -1.0) -> float:
        return self.success if self.success is not None else default


def gate_metrics(cand: GateScore | None, live: GateScore | None) -> dict[str, float]:
    """A gate's scores as the metrics of its `evo.weights_status` event (none without a gate)."""
    if cand is None or live is None:
        return {}
    return {**{f"candidate_{k}": v for k, v in cand.flat().items()}, **{f"live_{k}": v for k, v in live.flat().items()}}


class Canary(BaseModel):
    version: str
    baseline: str  # the live version its users' ratings are compared with
    started: float  # its ratings count from then on


class Passed(BaseModel):
    """The running canary's successor: it passed its gate `against` the canary and waits to become
    the next canary."""

    version: str
    against: str
    why: str
    cand: GateScore
    live: GateScore


@dataclass(frozen=True)
class GateOutcome:
    version: str
    against: str
    ok: bool
    why: str
    cand: GateScore
    live: GateScore


# ---------------------------------------------------------------------------- actions
@dataclass(frozen=True)
class Stage:
    """A published version waits for its gate."""

    version: str
    reason: str


@dataclass(frozen=True)
class Ignore:
    """A published version older than live: not gated (logged only)."""

    version: str
    live: str


@dataclass(frozen=True)
class Restage:
    """A gate a crash cut short: evaluated again."""

    version: str
    reason: str


@dataclass(frozen=True)
class Supersede:
    version: str
    reason: str


@dataclass(frozen=True)
class StartGate:
    """Score `version` against `against` (live or the canary) on the held-out gate; its outcome decides next."""

    version: str
    against: str
    reason: str


@dataclass(frozen=True)
class Reject:
    version: str
    reason: str
    cand: GateScore
    live: GateScore


@dataclass(frozen=True)
class Pass:
    """Passed its gate against the running canary: the canary after it."""

    version: str
    against: str
    reason: str
    cand: GateScore
    live: GateScore


@dataclass(frozen=True)
class StartCanary:
    """Serve `version` to `gate.canary_share` of the requests, measured against `baseline` (live)
    from `started`."""

    version: str
    baseline: str
    reason: str
    cand: GateScore
    live: GateScore
    started: float


@dataclass(frozen=True)
class GoLive:
    version: str
    reason: str
    cand: GateScore | None = None  # the gate's scores, when the gate put it live (no canary)
    live: GateScore | None = None


@dataclass(frozen=True)
class RollBack:
    version: str
    to: str
    reason: str


@dataclass(frozen=True)
class Prune:
    """Remove weights files beyond `gate.keep_versions`, never those the book protects."""


Action = Stage | Ignore | Restage | Supersede | StartGate | Reject | Pass | StartCanary | GoLive | RollBack | Prune
