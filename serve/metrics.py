"""Prometheus metrics of a Serve replica, at `GET /metrics` behind the API key (prometheus_client's text format).

What the replica measures itself: request latency and tokens/s of the answers it served, weight swaps, the depth of
its outbox. What the evolution does, as the event stream tells every replica (a plain NATS subscription to five small
event kinds, nothing durable): interaction -> served seconds (from the oldest judged group a version learned from to
its first serving, canary or live; the learner's `learned_from_ts`), gate and lifecycle decisions by status and
reason, the held-out score of each version the guard scored (and the base's), and the learner's informative-group
share. Each replica keeps its own registry; a restart resets its counters, which Prometheus' rate() handles.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from datetime import datetime

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from actors.events import HeldoutScored, LearnerStep, WeightsPromoted, WeightsPublished, WeightsStatus

KINDS = ("learner_step", "weights_published", "weights_status", "weights_promoted", "heldout_scored")
CONTENT_TYPE = CONTENT_TYPE_LATEST
KEEP_VERSIONS = 50  # held-out gauges kept per version (older ones are removed: label sets stay bounded)
_WORD = re.compile(r"[a-z][a-z_-]*")


def reason_kind(reason: str) -> str:
    """A bounded label from a free-text reason: its leading words up to the first figure ("held-out success 0.250 vs
    live 0.500" -> "held-out success"; "canary feedback worse: mean ..." -> "canary feedback worse")."""
    words = []
    for w in reason.lower().replace(":", " ").replace(",", " ").split()[:3]:
        if not _WORD.fullmatch(w):
            break
        words.append(w)
    return " ".join(words) or "other"


class Metrics:
    def __init__(self, outbox_depth=None):
        r = self.registry = CollectorRegistry()
        self.request_s = Histogram(
            "kaizen_request_seconds",
            "Chat request latency, request to recorded answer",
            ["stream"],
            registry=r,
            buckets=(0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120, 300),
        )
        self.tokens = Counter("kaizen_generated_tokens", "Completion tokens generated for users", registry=r)
        self.tokens_per_s = Histogram(
            "kaizen_tokens_per_second",
            "Completion tokens per second of each answer",
            registry=r,
            buckets=(1, 2, 5, 10, 20, 40, 80, 160, 320),
        )
        self.swap_s = Histogram(
            "kaizen_swap_seconds",
            "A weights swap inside this replica",
            registry=r,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
        )
        self.outbox = Gauge("kaizen_outbox_depth", "Interactions, feedback and reports waiting for the bus", registry=r)
        if outbox_depth is not None:
            self.outbox.set_function(outbox_depth)
        self.served_after = Histogram(
            "kaizen_interaction_to_served_seconds",
            "From the oldest judged group a version learned from to its first serving (canary or live)",
            registry=r,
            buckets=(30, 60, 90, 120, 180, 240, 300, 450, 600, 900, 1800),
        )
        self.decisions = Counter(
            "kaizen_weights_decisions",
            "Weights lifecycle moves (gate, canary, guard, rollback) by status and reason",
            ["status", "reason"],
            registry=r,
        )
        self.heldout = Gauge(
            "kaizen_heldout_score", "Held-out success of a served version (guard suite)", ["version", "env"], registry=r
        )
        self.heldout_base = Gauge(
            "kaizen_heldout_base_score", "Held-out success of the base on the same suite", ["env"], registry=r
        )
        self.informative = Gauge(
            "kaizen_informative_group_share",
            "Share of rollout groups with any advantage (the learner's, at its last step)",
            registry=r,
        )
        self.live_share = Gauge(
            "kaizen_live_training_share", "Share of the last learner step's new groups that came from live traffic", registry=r
        )
        self._learned_from: OrderedDict[int, float] = OrderedDict()  # learner step -> its oldest new group's time
        self._step_of: OrderedDict[str, int] = OrderedDict()  # version -> learner step
        self._served: OrderedDict[str, None] = OrderedDict()
        self._scored: OrderedDict[tuple[str, str], None] = OrderedDict()

    # ------------------------------------------------------------------ what this replica measures
    def answered(self, stream: bool, seconds: float, tokens: int) -> None:
        self.request_s.labels(stream=str(bool(stream)).lower()).observe(seconds)
        self.tokens.inc(max(0, tokens))
        if seconds > 0 and tokens > 0:
            self.tokens_per_s.observe(tokens / seconds)

    def swapped(self, seconds: float) -> None:
        self.swap_s.observe(seconds)

    # ------------------------------------------------------------------ what the event stream says
    def on_event(self, ev) -> None:
        if isinstance(ev, LearnerStep):
            _put(self._learned_from, ev.step, ev.metrics.get("learned_from_ts", 0.0))
            if "informative_share" in ev.metrics:
                self.informative.set(ev.metrics["informative_share"])
            new = sum(ev.metrics.get(f"groups_{o}", 0.0) for o in ("env", "synthetic", "live"))
            if new:
                self.live_share.set(ev.metrics.get("groups_live", 0.0) / new)
        elif isinstance(ev, WeightsPublished):
            _put(self._step_of, ev.weights.version, ev.weights.step)
        elif isinstance(ev, WeightsStatus):
            self.decisions.labels(status=str(ev.status), reason=reason_kind(ev.reason)).inc()
        elif isinstance(ev, WeightsPromoted) and ev.weights.version not in self._served:
            _put(self._served, ev.weights.version, None)
            t0 = self._learned_from.get(self._step_of.get(ev.weights.version, -1), 0.0)
            if t0 > 0:
                self.served_after.observe(max(0.0, datetime.fromisoformat(ev.occurred_at).timestamp() - t0))
        elif isinstance(ev, HeldoutScored):
            self.heldout.labels(version=ev.version, env=ev.env).set(ev.avg)
            self.heldout_base.labels(env=ev.env).set(ev.base_avg)
            for version, env in _put(self._scored, (ev.version, ev.env), None, keep=KEEP_VERSIONS):
                self.heldout.remove(version, env)

    async def follow(self, nc, prefix: str, log=None) -> None:
        """Subscribe this replica to the event kinds above (plain NATS: new events only)."""
        from actors.events import parse_event, subject_for

        async def on_msg(msg):
            try:
                self.on_event(parse_event(msg.data))
            except Exception as exc:  # a metric is never worth a failed replica
                if log is not None:
                    log.warning("metrics.event_skipped", error=repr(exc)[:200])

        for kind in KINDS:
            await nc.subscribe(subject_for(kind, prefix), cb=on_msg)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _put(d: OrderedDict, key, value, keep: int = 1000) -> list:
    """Insert into a bounded map; returns the keys it dropped (oldest first)."""
    d[key] = value
    d.move_to_end(key)
    dropped = []
    while len(d) > keep:
        dropped.append(d.popitem(last=False)[0])
    return dropped
