"""Promotion as a pure state machine: from the broadcaster's book, the time and the scores, the
actions to take.

No NATS, no Ray, no files: each function reads a `PromotionBook` (statuses, history, canary, passed
successor, users' ratings per version, the guard's hold), the version served now (`live`), the
lineage (`descends(v, w)`: v is w or was trained from it) and the gate settings, and returns
`policies/promotion/models.py` actions in the order the broadcaster carries them out
(`actors/broadcaster.py`). Where one decision follows another within a tick, the later one reads the
book as the earlier left it: the plan applies each action to a copy (`PromotionBook.apply`, the same
function the broadcaster records with).

A tick (`plan`), in README's words ("How one improvement cycle flows", items 3 and 5):
  1. a running canary's verdict on users' ratings against its baseline's since it started
     (`canary_verdict`): live after `canary_min_feedback` ratings on both sides unless significantly
     worse (rolled back then), or live after `canary_max_s` without enough of them;
  2. while the guard holds serving (a served version below the base) nothing new is gated or served;
  3. with a canary running, its newest staged successor is gated against it; once one has passed,
     the canary goes live after `canary_min_s` unless its ratings so far are `rollback_margin` below
     live's (`handoff_verdict`), and the passed successor becomes the canary at once. With
     `gate.live_after_guard` a canary goes live (in 1 or here) only once the guard has checked it
     no worse than the base: a version below it reaches the canary's share of users, never all;
  4. otherwise the live watch: live's last `watch_feedback` ratings against the version it replaced
     (`watch_verdict`) roll it back; if it stays, a passed version becomes the canary (superseded
     when what it was gated against is not live), else the newest staged version is gated against
     live (older ones superseded).
A gate's outcome (`gated`): rejected; passed against the running canary (then 3's handoff is looked
at again); a canary when `canary_share` > 0; else live. Going live and rejecting prune old files.
"""

from __future__ import annotations

from actors.events import WeightsPublished
from actors.lifecycles import WeightsState as S
from policies.promotion.book import PromotionBook
from policies.promotion.feedback_checks import canary_verdict, handoff_verdict, watch_verdict
from policies.promotion.models import (
    Action,
    GateOutcome,
    GoLive,
    Ignore,
    Pass,
    Prune,
    Reject,
    Restage,
    RollBack,
    Stage,
    StartCanary,
    StartGate,
    Supersede,
)
from policies.weights.model_store import version_number


class _Tick:
    """The actions decided so far, applied to a copy of the book, and the version they leave live."""

    def __init__(self, book: PromotionBook, live: str, descends):
        self.book, self.live, self.descends, self.out = book.copy(), live, descends, []

    def do(self, *actions: Action) -> None:
        for a in actions:
            self.out.append(a)
            self.book.apply(a, self.live, self.descends)
            if isinstance(a, GoLive):
                self.live = a.version
            elif isinstance(a, RollBack):
                self.live = a.to


def plan(book: PromotionBook, now: float, g, live: str, descends) -> list[Action]:
    """One tick's decisions (see the module docstring). A `StartGate` is always last: what follows
    depends on its outcome (`gated`)."""
    t = _Tick(book, live, descends)
    b = t.book
    if b.canary:
        _canary(t, now, g)
    if b.hold:  # the guard found the served lineage below the base: nothing new until it clears one
        pass
    elif b.canary:
        c = b.canary
        if b.passed is None and (staged := b.staged(keep=lambda v: descends(v, c.version))):
            _gate(t, staged, c.version)
        elif b.passed is not None:
            _handoff(t, now, g)
    elif not _watch(t, g):
        if b.passed:
            _start_canary(t, now)
        elif staged := b.staged():
            _gate(t, staged, t.live)
    return t.out


def gated(book: PromotionBook, o: GateOutcome, now: float, g, live: str, descends) -> list[Action]:
    """What a gate's outcome leads to."""
    t = _Tick(book, live, descends)
    if not o.ok:
        t.do(Reject(o.version, o.why, o.cand, o.live), Prune())
    elif g.canary_share <= 0:
        t.do(GoLive(o.version, o.why, o.cand, o.live), Prune())
    elif o.against != t.live:  # the running canary's successor
        t.do(Pass(o.version, o.against, o.why, o.cand, o.live))
        if t.book.canary:
            _handoff(t, now, g)
    else:
        t.do(StartCanary(o.version, t.live, o.why, o.cand, o.live, now))
    return t.out


def published(book: PromotionBook, ev: WeightsPublished, live: str) -> list[Action]:
    """A verified `evo.weights_published`: forced live by an operator, or staged unless known or
    older than live."""
    w = ev.weights
    if ev.force:
        why = f"forced by an operator{': ' + ev.reason if ev.reason else ''}"
        return [GoLive(w.version, why), Prune()] if w.version != live else []
    if book.status.get(w.version) is not None:
        return []  # known already (a redelivery)
    if version_number(w.version) <= version_number(live):
        return [Ignore(w.version, live)]
    return [Stage(w.version, f"published by the learner (step {w.step}, parent {w.parent})")]


def resumed(book: PromotionBook) -> list[Action]:
    """On start: a gate a crash cut short is run again."""
    return [
        Restage(v, "the broadcaster restarted during its gate: evaluated again")
        for v, st in book.status.items()
        if st == S.EVALUATING
    ]


def undone(steps: list[tuple[str, str, str | None, str]]) -> list[Action]:
    """The guard's `rollback_plan` as actions."""
    return [Supersede(v, why) if act == "supersede" else RollBack(v, to, why) for act, v, to, why in steps]


def held(book: PromotionBook, staged: list[str]) -> list[Action]:
    """While serving is held the guard checks the newest candidate; older ones will not be served."""
    if not book.hold:
        return []
    why = f"a newer candidate came while serving was held ({book.hold})"
    return [Supersede(v, why) for v in staged[:-1]]


def comparator_todo(book: PromotionBook, live: str, staged: list[str], unscored) -> tuple[str, dict[str, int]] | None:
    """No gate to run now: (the next gate's comparator, the one environment of its first look to
    score this tick), so that the gate waits for its candidate only. `unscored(version)`: env ->
    entries of its first look not cached yet."""
    nxt = book.next_comparator(live)
    if (not staged or book.passed) and (todo := list(unscored(nxt).items())[:1]):
        return nxt, dict(todo)
    return None


# ---------------------------------------------------------------------------- a tick's steps
def _canary(t: _Tick, now: float, g) -> None:
    b, c = t.book, t.book.canary
    verdict, why = canary_verdict(
        b.scores(c.version, c.started),
        b.scores(c.baseline, c.started),
        min_feedback=g.canary_min_feedback,
        margin=g.rollback_margin,
        elapsed_s=now - c.started,
        max_s=g.canary_max_s,
    )
    if verdict == "live":
        if _cleared(t, c.version, g):
            t.do(GoLive(c.version, why + _checked(g)), Prune())
    elif verdict == "rollback":
        t.do(RollBack(c.version, c.baseline, why))


def _handoff(t: _Tick, now: float, g) -> None:
    b, c, p = t.book, t.book.canary, t.book.passed
    ok, why = handoff_verdict(
        b.scores(c.version, c.started),
        b.scores(c.baseline, c.started),
        elapsed_s=now - c.started,
        min_s=g.canary_min_s,
        margin=g.rollback_margin,
    )
    if ok and _cleared(t, c.version, g):
        t.do(GoLive(c.version, f"{p.version} passed its gate against it; {why}{_checked(g)}"), Prune())
        _start_canary(t, now)


def _cleared(t: _Tick, version: str, g) -> bool:
    """With `gate.live_after_guard` a canary goes live only once the guard has checked it no worse than the base;
    until then it stays the canary, whatever its ratings and its time say (a `below` verdict rolls it back)."""
    return not g.live_after_guard or t.book.checks.get(version) == "not_below"


def _checked(g) -> str:
    return "; the guard checked it no worse than the base" if g.live_after_guard else ""


def _watch(t: _Tick, g) -> bool:
    h = t.book.history
    if len(h) < 2 or h[-1] != t.live:
        return False
    roll, why = watch_verdict(t.book.scores(h[-1]), t.book.scores(h[-2]), window=g.watch_feedback, margin=g.rollback_margin)
    if roll:
        t.do(RollBack(h[-1], h[-2], why))
    return roll


def _start_canary(t: _Tick, now: float) -> None:
    """The passed version becomes the canary, if what it was gated against is live; else it is
    superseded."""
    p = t.book.passed
    if p.against != t.live:
        t.do(Supersede(p.version, f"gated against {p.against}, but {t.live} is live"))
    else:
        t.do(StartCanary(p.version, t.live, p.why, p.cand, p.live, now))


def _gate(t: _Tick, staged: list[str], against: str) -> None:
    newest = staged[-1]
    t.do(*(Supersede(v, f"{newest} was staged before it was evaluated") for v in staged[:-1]))
    which = "live" if against == t.live else "canary"
    t.do(StartGate(newest, against, f"held-out gate against {which} {against}"))
