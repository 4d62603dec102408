"""The loop every actor runs: `run()` -> `_loop()` -> `_once()` -> `handle_<kind>()`.

Acks are the error policy: ack on success, nak(delay) on `Transient`, term + `dead_letter` on
`Poison` or after `max_deliver` attempts. Handlers are idempotent by `event_id`: applied ids are
kept in a small sqlite file per actor in the state dir. A handler returns `HOLD` when it acks the
message itself later (the learner); `heartbeat` keeps long-held messages from being redelivered.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from pathlib import Path

from opentelemetry import trace
from pydantic import ValidationError

from actors import events
from actors.bus import Bus, Poison, Transient
from actors.events import parse_event
from config import telemetry

HOLD = object()  # a handler returns HOLD when it acks the message itself later (e.g. the learner)


class AppliedIds:
    """Event ids an actor has applied, durable across restarts (sqlite in the state dir). With `keep_s` (the stream's
    `max_age`), ids older than that go, at open and every `PRUNE_EVERY` adds: their events have left the stream, so
    nothing can deliver them again."""

    PRUNE_EVERY = 10_000

    def __init__(self, path: Path, keep_s: float = 0.0):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(path), check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("CREATE TABLE IF NOT EXISTS applied (event_id TEXT PRIMARY KEY, at REAL)")
        self.keep_s, self.added = keep_s, 0
        self.prune()

    def __contains__(self, event_id: str) -> bool:
        return self.db.execute("SELECT 1 FROM applied WHERE event_id=?", (event_id,)).fetchone() is not None

    def add(self, event_id: str) -> None:
        self.db.execute("INSERT OR IGNORE INTO applied VALUES (?, ?)", (event_id, time.time()))
        self.db.commit()
        self.added += 1
        if self.added % self.PRUNE_EVERY == 0:
            self.prune()

    def prune(self, now: float | None = None) -> None:
        if self.keep_s > 0:
            self.db.execute("DELETE FROM applied WHERE at < ?", ((now or time.time()) - self.keep_s,))
        self.db.commit()


def first_consumer(name: str) -> str:
    """The durable consumer of an actor's `first_kinds`."""
    return f"{name}-first"


class EventActor:
    """Base loop of every actor. Subclasses set `name`, `kinds`, and write `handle_<kind>()`. Kinds in `first_kinds`
    are read by a durable consumer of their own (`<name>-first`), one at a time, ahead of the others."""

    name: str = "actor"
    kinds: tuple[str, ...] = ()
    first_kinds: tuple[str, ...] = ()
    batch: int = 8
    fetch_timeout_s: float = 1.0
    nak_delay_s: float = 2.0

    def __init__(self, settings, bus: Bus | None = None):
        self.settings = settings
        self.bus = bus
        self.stop = asyncio.Event()
        self.applied = AppliedIds(settings.state / "actors" / f"{self.name}.db", settings.nats.max_age_days * 86400)
        self.log = telemetry.log(actor=self.name)
        self.tracer = telemetry.tracer(f"kaizen.{self.name}")
        self.weights_version = "w-000000"
        self.handled = 0
        self.failures = 0
        self.last_error: str | None = None
        self._sub = self._first = None

    # -------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        """Connect, bind the durable consumer; subclasses extend (load models, open stores)."""
        if self.settings.telemetry.strict_events:
            events.strict()
        if self.bus is None:
            self.bus = await Bus.from_settings(self.settings.nats, self.name).connect()
        n = self.settings.nats
        if self.kinds:
            self._sub = await self.bus.pull(self.name, list(self.kinds), ack_wait_s=n.ack_wait_s, max_deliver=n.max_deliver)
        if self.first_kinds:
            self._first = await self.bus.pull(
                first_consumer(self.name), list(self.first_kinds), ack_wait_s=n.ack_wait_s, max_deliver=n.max_deliver
            )

    async def run(self) -> None:
        await self.start()
        self.log.info("actor.started", kinds=list(self.kinds))
        try:
            await self._loop()
        finally:
            await self.shutdown()

    async def shutdown(self) -> None:
        if self.bus:
            await self.bus.close()

    async def _loop(self) -> None:
        while not self.stop.is_set():
            try:
                await self._once()
                await self.tick()
            except Exception as exc:  # log and survive a failed tick
                self.failures += 1
                self.last_error = repr(exc)[:500]
                self.log.exception("actor.tick_failed")
                await asyncio.sleep(1.0)

    async def tick(self) -> None:
        """Periodic work between fetches (questioner's pacing, learner's batching)."""

    async def beat_held(self, every_s: float = 15.0) -> None:
        """Tell the server that the messages in `self.held` are still being worked on, at most once per `every_s`."""
        held = getattr(self, "held", None)
        if not held or time.monotonic() - getattr(self, "_last_beat", 0.0) <= every_s:
            return
        self._last_beat = time.monotonic()
        for m in list(held.values()):
            with contextlib.suppress(Exception):
                await m.in_progress()

    async def _once(self) -> None:
        if self._first is not None:
            try:
                msgs = await self._first.fetch(1, timeout=0.05 if self._sub is not None else self.fetch_timeout_s)
            except TimeoutError:
                msgs = []
            for msg in msgs:
                await self._dispatch(msg)
            if msgs:
                return
        if self._sub is None:
            if self._first is None:
                await asyncio.sleep(self.fetch_timeout_s)
            return
        try:
            msgs = await self._sub.fetch(self.batch, timeout=self.fetch_timeout_s)
        except TimeoutError:
            return
        for msg in msgs:
            await self._dispatch(msg)

    async def _dispatch(self, msg) -> None:
        try:
            event = parse_event(msg.data)
        except ValidationError as exc:
            await self._poison(msg, f"invalid event: {exc.errors()[:3]}", None)
            return
        log = self.log.bind(event_id=event.event_id, kind=event.kind, weights_version=event.weights_version)
        if event.event_id in self.applied:
            await msg.ack()
            return
        handler = getattr(self, f"handle_{event.kind}", None)
        if handler is None:
            await msg.ack()
            return
        ctx = telemetry.context_from_headers(msg.headers)
        with self.tracer.start_as_current_span(
            f"{self.name}.handle_{event.kind}", context=ctx, kind=trace.SpanKind.CONSUMER
        ) as span:
            span.set_attribute("kaizen.event_id", event.event_id)
            try:
                result = await handler(event, msg)
            except Poison as exc:
                await self._poison(msg, str(exc), event.event_id)
                return
            except Exception as exc:
                self.failures += 1
                self.last_error = repr(exc)[:500]
                delivered = msg.metadata.num_delivered
                if not isinstance(exc, Transient):
                    log.exception("handler.failed", delivered=delivered)
                if delivered >= self.settings.nats.max_deliver:
                    await self._poison(msg, f"failed {delivered} times: {exc!r}"[:2000], event.event_id)
                else:
                    await msg.nak(delay=self.nak_delay_s * delivered)
                return
        if result is HOLD:
            return
        self.applied.add(event.event_id)
        await msg.ack_sync()
        self.handled += 1

    async def _poison(self, msg, reason: str, event_id: str | None) -> None:
        self.log.warning("event.dead_lettered", reason=reason[:300], event_id=event_id)
        await self.bus.dead_letter(msg, self.name, reason, event_id)
        await msg.term()

    def health(self) -> dict:
        return {
            "actor": self.name,
            "handled": self.handled,
            "failures": self.failures,
            "last_error": self.last_error,
            "weights_version": self.weights_version,
        }


@contextlib.asynccontextmanager
async def heartbeat(msgs, every_s: float = 15.0):
    """Keep long-held messages from being redelivered while work is in progress."""

    async def beat():
        while True:
            await asyncio.sleep(every_s)
            for m in list(msgs):
                with contextlib.suppress(Exception):
                    await m.in_progress()

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
