"""The stream as the command line shows it: `events` (a live tail, one line per event, read through the
event models) and `read_events` (every stored event of some kinds, for `report` and the benchmarks).
A kind is read on all its subjects (`actors.events.subjects_of`): interactions are stored one subject per id.
"""

from __future__ import annotations

import asyncio
import time

from pydantic import ValidationError

from actors import events as E
from actors import task_events as T
from actors.messages import Event
from config.settings import Settings


async def connect(s: Settings, run: dict):
    from actors.bus import Bus

    pw = (s.state / "nats.password").read_text().strip() if (s.state / "nats.password").exists() else s.nats.password
    bus = Bus.from_settings(s.nats, "cli", run["nats_url"], run["nats_user"], pw)
    return await bus.connect(ensure_stream=False, attempts=3, connect_timeout=5.0)


def summarize(ev: Event) -> str:
    """One line per event, read through its model."""
    if isinstance(ev, E.Interaction):
        return f"{ev.interaction_id} user={ev.user_hash[:8]} replica={ev.replica} experiences={len(ev.experience_ids)}"
    if isinstance(ev, E.Feedback):
        return f"{ev.interaction_id} score={ev.score}"
    if isinstance(ev, T.Task):
        return f"{ev.task_id} origin={ev.origin}" + (f" query={ev.query[:80]!r}" if ev.origin == "synthetic" else "")
    if isinstance(ev, T.TaskStatus):
        p = f" consistency={ev.consistency:.2f}" if ev.consistency is not None else ""
        return f"{ev.task_id} {ev.status}{p}: {ev.reason[:100]}"
    if isinstance(ev, T.Rollout):
        return f"{ev.task.task_id} outcomes={[round(x.outcome, 2) for x in ev.samples]} {ev.duration_s:.0f}s"
    if isinstance(ev, E.Judgement):
        agree = f" agreement={ev.agreement:.2f}" if ev.agreement is not None else ""
        return f"{ev.task_id[:40]} origin={ev.origin} judge={ev.judge} outcomes={[round(x, 2) for x in ev.outcomes]}{agree}"
    if isinstance(ev, E.Experience):
        return f"{'success' if ev.success else 'failure'}: {ev.text[:100]}"
    if isinstance(ev, E.LearnerStep):
        m = ev.metrics
        mix = " ".join(f"{o}={int(m[f'groups_{o}'])}" for o in ("env", "synthetic", "live") if m.get(f"groups_{o}"))
        return f"step={ev.step} loss={ev.loss:.4f} reward={ev.mean_reward:.3f} samples={ev.samples} {mix}"
    if isinstance(ev, (E.WeightsPublished, E.WeightsPromoted, E.WeightsRejected)):
        extra = ""
        if not isinstance(ev, E.WeightsPublished):
            extra = f" candidate={ev.candidate_score:.3f} live={ev.live_score:.3f}"
            if ev.candidate_nll is not None and ev.live_nll is not None:
                extra += f" nll={ev.candidate_nll:.3f}/{ev.live_nll:.3f}"
        if isinstance(ev, E.WeightsPromoted):
            extra += f" stage={ev.stage}" + (f" share={ev.canary_share}" if ev.stage == "canary" else "")
        if isinstance(ev, E.WeightsPublished) and ev.force:
            extra += " forced"
        return f"{ev.weights.version} sha256={ev.weights.sha256[:12]}{extra}"
    if isinstance(ev, E.WeightsStatus):
        return f"{ev.version} {ev.previous_status or 'new'} -> {ev.status}: {ev.reason[:110]}"
    if isinstance(ev, E.WeightsRolledBack):
        return f"{ev.from_version} -> {ev.to.version}: {ev.reason[:110]}"
    if isinstance(ev, E.WeightsSwapped):
        canary = f" canary={ev.canary}" if ev.canary else ""
        return f"{ev.version}{canary} replica={ev.replica} swap_ms={ev.swap_ms:.0f} {ev.reason}"
    if isinstance(ev, E.DeadLetter):
        return f"{ev.subject} consumer={ev.consumer} reason={ev.reason[:120]}"
    return ""


def line(ev: Event) -> str:
    return f"{ev.occurred_at[11:19]} {ev.kind:<18} {ev.weights_version:<9} {summarize(ev)}"


def show_events(s: Settings, run: dict, args) -> int:
    """`main.py events`: a live tail of evo.> (or a subject), or the stored events too with --all."""

    async def tail():
        from nats.js import api

        bus = await connect(s, run)
        subjects = follows(s.nats.subject_prefix, args.subject)
        policy = api.DeliverPolicy.ALL if args.all else api.DeliverPolicy.NEW
        cfg = api.ConsumerConfig(deliver_policy=policy, filter_subjects=subjects if len(subjects) > 1 else None)
        sub = await bus.js.subscribe(subjects[0], stream=s.nats.stream, ordered_consumer=True, config=cfg)
        deadline = time.monotonic() + args.seconds if args.seconds else None
        try:
            while deadline is None or time.monotonic() < deadline:
                try:
                    m = await sub.next_msg(timeout=1.0)
                except (TimeoutError, asyncio.TimeoutError):
                    continue
                try:
                    print(line(E.parse_event(m.data)), flush=True)
                except ValidationError as exc:
                    print(f"{m.subject} <not a valid event ({exc.error_count()} errors), {len(m.data)} bytes>", flush=True)
        finally:
            await bus.close()

    try:
        asyncio.run(tail())
    except KeyboardInterrupt:
        pass
    return 0


def follows(prefix: str, subject: str | None) -> list[str]:
    """The subjects `events [SUBJECT]` tails: every event, a kind's subjects, or a subject as given."""
    if not subject:
        return [f"{prefix}.>"]
    kind = subject.removeprefix(prefix + ".")
    return E.subjects_of(kind, prefix) if kind in E.KINDS else [f"{prefix}.{kind}"]


async def read_events(s: Settings, run: dict, kinds: list[str]) -> list:
    """Every stored event of these kinds, oldest first, as event models (unparseable ones are skipped)."""
    from nats.js import api
    from nats.js.errors import NotFoundError

    bus = await connect(s, run)
    out = []
    try:
        for subject in [x for kind in kinds for x in E.subjects_of(kind, s.nats.subject_prefix)]:
            try:  # is anything stored there? (the stream's subject index answers; `evo.interaction.*` too)
                await bus.js.get_last_msg(s.nats.stream, subject)
            except NotFoundError:
                continue
            sub = await bus.js.subscribe(
                subject,
                stream=s.nats.stream,
                ordered_consumer=True,
                config=api.ConsumerConfig(deliver_policy=api.DeliverPolicy.ALL),
            )
            try:
                while True:
                    try:
                        m = await sub.next_msg(timeout=5.0)
                    except (TimeoutError, asyncio.TimeoutError):
                        break
                    try:
                        out.append(E.parse_event(m.data))
                    except ValidationError:
                        pass
                    if m.metadata.num_pending == 0:  # the last one stored when it was delivered
                        break
            finally:
                await sub.unsubscribe()
    finally:
        await bus.close()
    return sorted(out, key=lambda e: e.occurred_at)
