"""The evolution as one document, folded from the stored event stream: what the live page shows (`serve/page.py`,
GET /page/state) and what `main.py report --json` prints. Both fold the same stored events with this one class, in
stream order, so the page and the report cannot disagree.

`Evolution.feed(messages, seq)` folds stored events (subject, JSON) read up to stream sequence `seq`; `catch_up`
reads and folds what the stream holds beyond that. `view()` is the document:
- rows: the lineage of weights versions (`policies/evaluation/lineage.py`: parent, step, gate decision and reason, canary
  verdict, seconds per stage, interaction -> served);
- heldout: version -> env -> the guard's newest check of it (`evo.heldout_scored`): avg@k with its 95% interval, the
  base's rate on the same entries, the paired delta and p, the verdict;
- base: env -> the base's rate on the guard's suite, from the check that scored the most entries;
- curve: env -> arrays in learner-step order, the base at step 0 and then each scored version: what the chart draws;
- memory: the experience pool (active, quarantined, retired; near-duplicates merged), retrievals (served requests
  with experiences in context, guided rollout samples) and what helped, counted as the navigator counts it (guided
  samples beat unguided ones of their group, or the user rated the request an experience was in above 0);
- signal: per learner step, the share of rollout groups that were informative (own samples, and once references
  joined) and the share of its new groups that came from live traffic;
- stages: seconds per stage of one improvement cycle, p50 / p90 / last over the last STAGE_KEEP.

The interval is Wilson's with n = entries scored: an entry's avg@k varies no more than one draw at the same rate,
so it is conservative for the rate over entries. "Newest" is by stream order; an event id seen among the last
SEEN_KEEP is skipped (a publish retried after JetStream's duplicate window).
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter, OrderedDict, deque
from datetime import datetime

from actors.events import (
    Experience,
    Feedback,
    HeldoutScored,
    Interaction,
    Judgement,
    LearnerStep,
    WeightsPromoted,
    WeightsPublished,
    WeightsRolledBack,
    WeightsStatus,
    kind_of,
    parse_event,
)
from actors.task_events import Rollout
from policies.evaluation.lineage import lineage
from policies.memory.experience import guided_helped
from policies.stats import wilson
from policies.weights.model_store import BASE_VERSION

KINDS = (
    "interaction",
    "feedback",
    "rollout",
    "judgement",
    "experience",
    "learner_step",
    "weights_published",
    "weights_status",
    "weights_promoted",
    "weights_rolled_back",
    "heldout_scored",
)
LINEAGE = (LearnerStep, WeightsPublished, WeightsStatus, WeightsPromoted, WeightsRolledBack)
STAGES = {
    "explore": "a rollout group generated",
    "judge": "rollout -> judgement",
    "learn": "one learner step",
    "publish": "judged groups -> version published",
    "gate": "published -> gate decision",
    "served": "interaction -> served (canary or live)",
}
SEEN_KEEP, KEEP, STAGE_KEEP, SIGNAL_KEEP, TOP = 20_000, 50_000, 500, 500, 5


def _t(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def _put(d: OrderedDict, key, value=None, keep: int = KEEP) -> None:
    d[key] = value
    d.move_to_end(key)
    while len(d) > keep:
        d.popitem(last=False)


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def _pct(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (None for no values)."""
    s = sorted(values)
    return s[max(0, math.ceil(q * len(s)) - 1)] if s else None


def _rate(avg: float, n: int) -> dict:
    lo, hi = wilson(avg, n)
    return {"avg": _r(avg), "lo": _r(lo), "hi": _r(hi), "n": n}


class Evolution:
    def __init__(self):
        self.seq = 0  # the stream sequence folded up to
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._lineage: list = []  # the lineage's own events (small: versions, statuses, learner steps)
        self._judged: OrderedDict[str, float] = OrderedDict()  # judgement id -> time (what a step learned from)
        self._rolled: OrderedDict[str, float] = OrderedDict()  # rollout id -> time, until judged
        self._checks: dict[tuple[str, str], HeldoutScored] = {}
        self._exps: dict[str, dict] = {}
        self._uses: dict[str, list[int]] = {}  # experience id -> [uses, helped]
        self._retrieved: OrderedDict[str, list[str]] = OrderedDict()  # interaction id -> its experience ids
        self._signal: OrderedDict[int, dict] = OrderedDict()
        self._stages = {"explore": deque(maxlen=STAGE_KEEP), "judge": deque(maxlen=STAGE_KEEP)}
        self.counts = Counter(interactions=0, with_memory=0, retrieved=0, guided_samples=0)

    # ------------------------------------------------------------------ folding
    def feed(self, messages: list[tuple[str, bytes]], seq: int) -> None:
        """Fold stored events in stream order (other kinds and events that do not parse are skipped)."""
        for subject, data in messages:
            if kind_of(subject, subject.partition(".")[0]) in KINDS:  # the prefix is the subject's first token
                try:
                    ev = parse_event(data)
                except ValueError:  # pydantic's ValidationError is one
                    continue
                self.add(ev)
        self.seq = max(self.seq, seq)

    def add(self, ev) -> None:
        if ev.event_id in self._seen:
            return
        _put(self._seen, ev.event_id, keep=SEEN_KEEP)
        if isinstance(ev, LINEAGE):
            self._lineage.append(ev)
        if isinstance(ev, Judgement):
            self._judgement(ev)
        elif isinstance(ev, Rollout):
            _put(self._rolled, ev.event_id, _t(ev.occurred_at))
            self._stages["explore"].append(round(ev.duration_s, 1))
        elif isinstance(ev, Interaction):
            self.counts["interactions"] += 1
            self.counts["with_memory"] += bool(ev.experience_ids)
            self.counts["retrieved"] += len(ev.experience_ids)
            if ev.experience_ids:
                _put(self._retrieved, ev.interaction_id, ev.experience_ids)
        elif isinstance(ev, Feedback):  # its interaction came first in the stream (a snapshot in earlier releases)
            used = ev.interaction.experience_ids if ev.interaction else self._retrieved.get(ev.interaction_id, [])
            for exp_id in used:
                self._use(exp_id, ev.score > 0)
        elif isinstance(ev, Experience):
            self._exps[ev.experience_id] = {
                "id": ev.experience_id,
                "state": ev.state,
                "success": ev.success,
                "origin": ev.origin,
                "support": ev.support,
                "text": ev.text[:160],
            }
        elif isinstance(ev, LearnerStep):
            m = ev.metrics
            new = sum(m.get(f"groups_{o}", 0.0) for o in ("env", "synthetic", "live"))
            _put(
                self._signal,
                ev.step,
                {
                    "informative": m.get("informative_share"),
                    "informative_own": m.get("informative_own_share"),
                    "live": m.get("groups_live", 0.0) / new if new else None,
                    "groups": ev.groups,
                },
                keep=SIGNAL_KEEP,
            )
        elif isinstance(ev, HeldoutScored):
            self._checks[(ev.version, ev.env)] = ev

    def _judgement(self, j: Judgement) -> None:
        t = _t(j.occurred_at)
        _put(self._judged, j.event_id, t)
        started = [self._rolled.pop(i) for i in j.source_event_ids if i in self._rolled]
        if j.source == "rollout" and started:
            self._stages["judge"].append(round(t - max(started), 1))
        self.counts["guided_samples"] += sum(s.guided for s in j.samples)
        for exp_id, helped in guided_helped(j).items():
            self._use(exp_id, helped)

    def _use(self, exp_id: str, helped: bool) -> None:
        u = self._uses.setdefault(exp_id, [0, 0])
        u[0] += 1
        u[1] += int(helped)

    # ------------------------------------------------------------------ the document
    def view(self) -> dict:
        rows = lineage(self._lineage, self._judged)
        heldout: dict[str, dict] = {}
        base: dict[str, dict] = {}
        for (version, env), h in self._checks.items():
            lo, hi = wilson(h.avg, h.entries)
            heldout.setdefault(version, {})[env] = {
                "avg": _r(h.avg),
                "lo": _r(lo),
                "hi": _r(hi),
                "base_avg": _r(h.base_avg),
                "delta": _r(h.delta),
                "p_value": _r(h.p_value),
                "wins": h.wins,
                "losses": h.losses,
                "n": h.entries,
                "suite_entries": h.suite_entries,
                "k": h.k,
                "verdict": h.verdict,
                "at": h.occurred_at,
            }
            if env not in base or h.entries >= base[env]["n"]:
                base[env] = _rate(h.base_avg, h.entries)
        return {
            "seq": self.seq,
            "rows": rows,
            "heldout": heldout,
            "base": base,
            "curve": {env: _curve(env, rows, heldout, base[env]) for env in sorted(base)},
            "memory": self._memory(),
            "signal": self._signal_view(),
            "stages": self._stage_view(rows),
        }

    def _memory(self) -> dict:
        states = Counter(e["state"] for e in self._exps.values())
        top = sorted(((u[1], u[0], i) for i, u in self._uses.items() if u[1] > 0), reverse=True)[:TOP]
        return {
            "active": states["active"],
            "quarantined": states["quarantined"],
            "retired": states["retired"],
            "merged": sum(e["support"] - 1 for e in self._exps.values()),
            **self.counts,
            "uses": sum(u[0] for u in self._uses.values()),
            "helped": sum(u[1] for u in self._uses.values()),
            "top": [
                {
                    "id": i,
                    "uses": uses,
                    "helped": helped,
                    **{k: self._exps.get(i, {}).get(k) for k in ("text", "state", "success", "origin")},
                }
                for helped, uses, i in top
            ],
        }

    def _signal_view(self) -> dict:
        steps = sorted(self._signal)
        return {
            "step": steps,
            **{k: [_r(self._signal[s][k]) for s in steps] for k in ("informative", "informative_own", "live", "groups")},
        }

    def _stage_view(self, rows: list[dict]) -> list[dict]:
        from_rows = {"learn": "step_s", "publish": "published_after_s", "gate": "gate_s", "served": "served_after_s"}
        out = []
        for stage, what in STAGES.items():
            if stage in from_rows:
                values = [r[from_rows[stage]] for r in rows if r[from_rows[stage]] is not None][-STAGE_KEEP:]
            else:
                values = list(self._stages[stage])
            out.append(
                {
                    "stage": stage,
                    "what": what,
                    "n": len(values),
                    "p50": _pct(values, 0.5),
                    "p90": _pct(values, 0.9),
                    "last": values[-1] if values else None,
                }
            )
        return out


def _curve(env: str, rows: list[dict], heldout: dict, base: dict) -> dict:
    pts = [(BASE_VERSION, 0, {**base, "p_value": None, "verdict": "base"})] + [
        (r["version"], r["step"], heldout[r["version"]][env]) for r in rows if env in heldout.get(r["version"], {})
    ]
    return {
        "version": [p[0] for p in pts],
        "step": [p[1] for p in pts],
        **{k: [p[2][k] for p in pts] for k in ("avg", "lo", "hi", "p_value", "verdict")},
        "base": [base["avg"]] * len(pts),
    }


async def catch_up(evo: Evolution, read, batch: int = 500) -> Evolution:
    """Fold whatever the stream holds beyond `evo.seq`. `read(seq, limit, kinds)` -> (messages, last sequence read)
    is `actors.bus.Bus.stored_since`; the folding runs in a thread (large histories stay off the event loop)."""
    while True:
        messages, seq = await read(evo.seq, batch, KINDS)
        if seq <= evo.seq:
            return evo
        await asyncio.to_thread(evo.feed, messages, seq)
