"""The broadcaster's book of weights versions: each version's lifecycle status, its `WeightsRef`, the
versions that went live (oldest first), the running canary and the passed successor waiting behind it,
users' ratings per version, what each replica serves, and counters.

It is what the broadcaster persists between restarts (one JSON file, written atomically); every status
change is also an `evo.weights_status` event, so the stream holds the history.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from actors.events import WeightsRef, WeightsStatus, derived_id
from actors.lifecycles import WeightsState as S, transition
from policies.guard import anchor
from policies.model_store import BASE_VERSION, WeightsStore, atomic_write_bytes, sha256_file, version_number

FEEDBACK_KEPT = 500  # ratings kept per version
HISTORY_KEPT = 50


def event_time(iso: str) -> float:
    try:
        return datetime.fromisoformat(iso).timestamp()
    except ValueError:
        return time.time()


@dataclass
class PromotionBook:
    path: Path
    status: dict[str, str]
    history: list[str]  # versions that went live, oldest first
    refs: dict[str, dict] = field(default_factory=dict)  # version -> WeightsRef fields
    canary: dict | None = None  # {"version", "baseline", "started"}
    passed: dict | None = None  # the canary after the running one: {"version", "against", "why", "cand", "live"}
    feedback: dict[str, list[list[float]]] = field(default_factory=dict)  # version -> [[time, score]]
    replicas: dict[str, dict] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=lambda: {"promoted": 0, "rejected": 0, "rolled_back": 0})
    checks: dict[str, str] = field(default_factory=dict)  # version -> the guard's verdict against the base
    hold: str | None = None  # a served version the guard found below the base: nothing new is served until it
    # clears a candidate (policies/guard.py)

    @classmethod
    def load(cls, path: Path, live: str) -> PromotionBook:
        st = json.loads(path.read_text()) if path.exists() else {}
        book = cls(path, st.get("status", {live: S.LIVE}), st.get("history", [live]))
        for k in ("refs", "canary", "passed", "feedback", "replicas", "counts", "checks", "hold"):
            if k in st:
                setattr(book, k, st[k])
        return book

    def save(self) -> None:
        atomic_write_bytes(self.path, json.dumps({
            "status": self.status, "refs": self.refs, "history": self.history[-HISTORY_KEPT:], "canary": self.canary,
            "passed": self.passed, "feedback": self.feedback, "replicas": self.replicas, "counts": self.counts,
            "checks": self.checks, "hold": self.hold}).encode())

    def move(self, version: str, new: S, reason: str, metrics: dict | None = None) -> WeightsStatus:
        """Change a version's status (IllegalTransition if the table forbids it); returns the event to publish."""
        old = self.status.get(version)
        transition(old, new)
        self.status[version] = new
        if self.passed and self.passed.get("version") == version and new != S.PASSED:
            self.passed = None  # the passed successor moved on: canary, live or superseded
        n = len(self.history)  # distinguishes a version going live a second time
        return WeightsStatus(event_id=derived_id("weights_status", f"{version}:{new}:{old}:{n}"),
                             version=version, status=new, previous_status=old, reason=reason[:1000],
                             metrics={k: float(v) for k, v in (metrics or {}).items()})

    def next_comparator(self, live: str) -> str:
        """The version the next gate compares its candidate with: the passed successor, else the canary, else live."""
        return (self.passed or self.canary or {}).get("version") or live

    def staged(self, keep=lambda v: True) -> list[str]:
        return sorted((v for v, st in self.status.items() if st == S.STAGED and keep(v)), key=version_number)

    def rate(self, version: str, at: float, score: float) -> None:
        rows = self.feedback.setdefault(version, [])
        rows.append([at, score])
        del rows[:-FEEDBACK_KEPT]

    def swapped(self, ev) -> None:
        """A replica's report of what it serves (`WeightsSwapped`)."""
        self.replicas[ev.replica] = {"version": ev.version, "canary": ev.canary, "swap_ms": round(ev.swap_ms, 1),
                                     "reason": ev.reason, "at": event_time(ev.occurred_at)}

    def scores(self, version: str, since: float = 0.0) -> list[float]:
        return [s for t, s in self.feedback.get(version, []) if t >= since]

    def summary(self) -> dict:
        return {**self.counts, "canary": self.canary, "passed": self.passed and self.passed["version"],
                "history": self.history[-5:], "replicas": self.replicas,
                "checked": dict(list(self.checks.items())[-5:]), "no_worse_than_base": anchor(self.history, self.checks),
                "hold": self.hold}

    def protected(self) -> set[str]:
        """Versions whose files must stay: live, recent live ones, every one still moving to users, and the
        newest live one checked no worse than the base (where the guard rolls back to)."""
        return {*self.history[-3:], *(v for v, st in self.status.items()
                                       if st in (S.STAGED, S.EVALUATING, S.PASSED, S.CANARY)),
                *filter(None, [anchor(self.history, self.checks)])}

    def descends(self, version: str, ancestor: str) -> bool:
        """`version` is `ancestor` or was trained from it, by the parents the learner published (the book keeps
        them after pruning removed the manifests)."""
        seen = set()
        while version and version not in seen:
            if version == ancestor:
                return True
            seen.add(version)
            version = (self.refs.get(version) or {}).get("parent", "")
        return False

    def ref(self, version: str, store: WeightsStore, base_path: Path) -> WeightsRef:
        """The version's WeightsRef: as published, or (the base, or one from before this book) from the store."""
        if version in self.refs:
            return WeightsRef(**self.refs[version])
        if version == BASE_VERSION:
            path = store.file(version, base_path)
            ref = WeightsRef(version=version, path=str(path), sha256=sha256_file(path), parent="", step=0)
        else:
            man = store.manifest(version) or {}
            ref = WeightsRef(version=version, path=man.get("path", ""), sha256=man.get("sha256", ""),
                             parent=man.get("parent", ""), step=int(man.get("step", 0)))
        self.refs[version] = ref.model_dump()
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
        if self.canary and self.status.get(self.canary["version"]) != S.CANARY:
            self.canary = None
        if self.passed and self.status.get(self.passed["version"]) != S.PASSED:
            self.passed = None
        return want, self.canary and self.canary["version"]
