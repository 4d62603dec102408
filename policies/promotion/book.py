"""The broadcaster's book of weights versions: each version's lifecycle status, its `WeightsRef`, the
versions that went live (oldest first), the running canary and the passed successor waiting behind it,
users' ratings per version, what each replica serves, and counters.

It is what the broadcaster persists between restarts (one JSON file, written atomically); every status
change is also an `evo.weights_status` event, so the stream holds the history. `apply` is the one place an
action of `policies/promotion/plan.py` changes it: the plan simulates a tick on a copy with it, the broadcaster
records what it carried out with it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from actors.events import WeightsRef, WeightsStatus, derived_id
from actors.lifecycles import IllegalTransition, transition
from actors.lifecycles import WeightsState as S
from actors.messages import event_time
from policies.promotion.guard_decisions import anchor
from policies.promotion.models import (
    Action,
    Canary,
    GoLive,
    Pass,
    Passed,
    Reject,
    Restage,
    RollBack,
    Stage,
    StartCanary,
    StartGate,
    Supersede,
    gate_metrics,
)
from policies.weights.model_store import BASE_VERSION, WeightsStore, atomic_write_bytes, sha256_file, version_number

FEEDBACK_KEPT = 500  # ratings kept per version
HISTORY_KEPT = 50
Change = WeightsStatus | IllegalTransition  # a status change's event, or the transition the table forbids (a bug)


@dataclass
class PromotionBook:
    path: Path
    status: dict[str, str]
    history: list[str]  # versions that went live, oldest first
    refs: dict[str, WeightsRef] = field(default_factory=dict)
    canary: Canary | None = None
    passed: Passed | None = None  # the canary after the running one
    feedback: dict[str, list[list[float]]] = field(default_factory=dict)  # version -> [[time, score]]
    replicas: dict[str, dict] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=lambda: {"promoted": 0, "rejected": 0, "rolled_back": 0})
    checks: dict[str, str] = field(default_factory=dict)  # version -> the guard's verdict against the base
    hold: str | None = None  # a served version the guard found below the base: nothing new is served until it
    # clears a candidate (policies/promotion/guard.py)

    @classmethod
    def load(cls, path: Path, live: str) -> PromotionBook:
        st = json.loads(path.read_text()) if path.exists() else {}
        book = cls(path, st.get("status", {live: S.LIVE}), st.get("history", [live]))
        for k in ("feedback", "replicas", "counts", "checks", "hold"):
            if k in st:
                setattr(book, k, st[k])
        book.refs = {v: WeightsRef.model_validate(r) for v, r in st.get("refs", {}).items()}
        book.canary = Canary.model_validate(st["canary"]) if st.get("canary") else None
        book.passed = Passed.model_validate(st["passed"]) if st.get("passed") else None
        return book

    def save(self) -> None:
        atomic_write_bytes(
            self.path,
            json.dumps(
                {
                    "status": self.status,
                    "refs": {v: r.model_dump() for v, r in self.refs.items()},
                    "history": self.history[-HISTORY_KEPT:],
                    "canary": self.canary and self.canary.model_dump(),
                    "passed": self.passed and self.passed.model_dump(),
                    "feedback": self.feedback,
                    "replicas": self.replicas,
                    "counts": self.counts,
                    "checks": self.checks,
                    "hold": self.hold,
                }
            ).encode(),
        )

    def copy(self) -> PromotionBook:
        """What `apply` changes copied, the rest shared: the plan's simulation of a tick (never saved)."""
        return replace(self, status=dict(self.status), history=list(self.history), counts=dict(self.counts))

    def move(self, version: str, new: S, reason: str, metrics: dict | None = None) -> WeightsStatus:
        """Change a version's status (IllegalTransition if the table forbids it); returns the event to publish."""
        old = self.status.get(version)
        transition(old, new)
        self.status[version] = new
        if self.passed and self.passed.version == version and new != S.PASSED:
            self.passed = None  # the passed successor moved on: canary, live or superseded
        n = len(self.history)  # distinguishes a version going live a second time
        return WeightsStatus(
            event_id=derived_id("weights_status", f"{version}:{new}:{old}:{n}"),
            version=version,
            status=new,
            previous_status=old,
            reason=reason[:1000],
            metrics={k: float(v) for k, v in (metrics or {}).items()},
        )

    def next_comparator(self, live: str) -> str:
        """The version the next gate compares its candidate with: the passed successor, else the canary, else live."""
        return next((x.version for x in (self.passed, self.canary) if x is not None), live)

    def staged(self, keep=lambda v: True) -> list[str]:
        return sorted((v for v, st in self.status.items() if st == S.STAGED and keep(v)), key=version_number)

    def rate(self, version: str, at: float, score: float) -> None:
        rows = self.feedback.setdefault(version, [])
        rows.append([at, score])
        del rows[:-FEEDBACK_KEPT]

    def swapped(self, ev) -> None:
        """A replica's report of what it serves (`WeightsSwapped`)."""
        self.replicas[ev.replica] = {
            "version": ev.version,
            "canary": ev.canary,
            "swap_ms": round(ev.swap_ms, 1),
            "reason": ev.reason,
            "at": event_time(ev.occurred_at),
        }

    def scores(self, version: str, since: float = 0.0) -> list[float]:
        return [s for t, s in self.feedback.get(version, []) if t >= since]

    def summary(self) -> dict:
        return {
            **self.counts,
            "canary": self.canary and self.canary.model_dump(),
            "passed": self.passed and self.passed.version,
            "history": self.history[-5:],
            "replicas": self.replicas,
            "checked": dict(list(self.checks.items())[-5:]),
            "no_worse_than_base": anchor(self.history, self.checks),
            "hold": self.hold,
        }

    def protected(self) -> set[str]:
        """Versions whose files must stay: live, recent live ones, every one still moving to users, and the
        newest live one checked no worse than the base (where the guard rolls back to)."""
        return {
            *self.history[-3:],
            *(v for v, st in self.status.items() if st in (S.STAGED, S.EVALUATING, S.PASSED, S.CANARY)),
            *filter(None, [anchor(self.history, self.checks)]),
        }

    def descends(self, version: str, ancestor: str) -> bool:
        """`version` is `ancestor` or was trained from it, by the parents the learner published (the book keeps
        them after pruning removed the manifests)."""
        seen = set()
        while version and version not in seen:
            if version == ancestor:
                return True
            seen.add(version)
            version = r.parent if (r := self.refs.get(version)) else ""
        return False

    def ref(self, version: str, store: WeightsStore, base_path: Path) -> WeightsRef:
        """The version's WeightsRef: as published, or (the base, or one from before this book) from the store."""
        if version in self.refs:
            return self.refs[version]
        if version == BASE_VERSION:  # hashed once: the pointer pins the stat verified here
            path = store.file(version, base_path)
            ref = WeightsRef(version=version, path=str(path), sha256=sha256_file(path), parent="", step=0)
            store.mark_verified(path)
        else:
            man = store.manifest(version) or {}
            ref = WeightsRef(
                version=version,
                path=man.get("path", ""),
                sha256=man.get("sha256", ""),
                parent=man.get("parent", ""),
                step=int(man.get("step", 0)),
            )
        self.refs[version] = ref
        return ref

    def repair_pointer(self, policy, ref, share: float) -> tuple | None:
        """LIVE is the projection of the lifecycle on the stream: a pointer written just before a crash that kept its
        status event off the stream names a version that is not live (or a canary that is not one) in the
        lifecycle; it is rewritten from the lifecycle. Returns (pointed, pointed canary, live, canary) when it was."""
        ptr = policy.pointer()
        want, canary = self.lifecycle_pointer(ptr.version)
        if (want, canary) == (ptr.version, ptr.canary.version if ptr.canary else None):
            return None
        policy.publish_live(ref(want), canary=ref(canary) if canary else None, share=share)
        return ptr.version, ptr.canary and ptr.canary.version, want, canary

    def lifecycle_pointer(self, pointed: str) -> tuple[str, str | None]:
        """(live, canary) as the lifecycle has them, for checking the LIVE pointer after a crash: the pointed
        version stays if the lifecycle has it live. A canary or passed record the lifecycle does not confirm
        is dropped."""
        live = sorted((v for v, st in self.status.items() if st == S.LIVE), key=version_number)
        want = pointed if pointed in live or not live else live[-1]
        if self.canary and self.status.get(self.canary.version) != S.CANARY:
            self.canary = None
        if self.passed and self.status.get(self.passed.version) != S.PASSED:
            self.passed = None
        return want, self.canary and self.canary.version

    # ------------------------------------------------------------------ actions
    def apply(self, a: Action, live: str, descends) -> list[Change]:
        """Record what action `a` changes, `live` being the version served before it and `descends(v, w)` the
        lineage; returns each status change's event (or its IllegalTransition), in order."""
        out: list[Change] = []

        def move(version: str, new: S, reason: str, metrics: dict | None = None) -> None:
            try:
                out.append(self.move(version, new, reason, metrics))
            except IllegalTransition as exc:
                out.append(IllegalTransition(f"{version}: {exc}"))

        if isinstance(a, (Stage, Restage)):
            move(a.version, S.STAGED, a.reason)
        elif isinstance(a, Supersede):
            if self.passed and self.passed.version == a.version:  # cleared even where the move is refused
                self.passed = None
            move(a.version, S.SUPERSEDED, a.reason)
        elif isinstance(a, StartGate):
            move(a.version, S.EVALUATING, a.reason)
        elif isinstance(a, Reject):
            move(a.version, S.REJECTED, a.reason, gate_metrics(a.cand, a.live))
            self.counts["rejected"] += 1
        elif isinstance(a, Pass):
            self.passed = Passed(version=a.version, against=a.against, why=a.reason, cand=a.cand, live=a.live)
            move(a.version, S.PASSED, f"{a.reason}; the canary after {a.against}", gate_metrics(a.cand, a.live))
        elif isinstance(a, StartCanary):
            self.passed, self.canary = None, Canary(version=a.version, baseline=a.baseline, started=a.started)
            move(a.version, S.CANARY, a.reason, gate_metrics(a.cand, a.live))
        elif isinstance(a, GoLive):
            self._go_live(a, live, move)
        elif isinstance(a, RollBack):
            self._roll_back(a, descends, move)
        return out

    def _go_live(self, a: GoLive, live: str, move) -> None:
        if self.canary and self.canary.version != a.version:
            move(self.canary.version, S.RETIRED, f"{a.version} went live during its canary")
        self.canary = None
        if self.passed and self.passed.version == a.version:  # forced live by an operator
            self.passed = None
        if live != a.version and self.status.get(live) == S.LIVE:
            move(live, S.RETIRED, f"replaced by {a.version}")
        if self.status.get(a.version) != S.LIVE:
            move(a.version, S.LIVE, a.reason, gate_metrics(a.cand, a.live))
        self.history.append(a.version)
        self.counts["promoted"] += 1

    def _roll_back(self, a: RollBack, descends, move) -> None:
        was_canary = bool(self.canary and self.canary.version == a.version)
        move(a.version, S.ROLLED_BACK, a.reason)
        self.canary = None
        if not was_canary:  # what went live after `to` leaves the history with the version rolled back
            h = self.history
            self.history = h[: len(h) - h[::-1].index(a.to)] if a.to in h else [v for v in h if v != a.version] + [a.to]
            if self.status.get(a.to) != S.LIVE:
                move(a.to, S.LIVE, f"rollback from {a.version}")
        self.counts["rolled_back"] += 1
        for v, st in list(self.status.items()):  # candidates trained from the bad version are not evaluated
            if st == S.STAGED and descends(v, a.version):
                move(v, S.SUPERSEDED, f"descends from {a.version}, which was rolled back")
