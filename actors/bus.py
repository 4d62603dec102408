"""JetStream plumbing shared by every actor and the Serve app.

- `Bus`: connect, ensure the `EVO` stream, publish typed events (event_id doubles as
  `Nats-Msg-Id`, trace context in headers), durable pull consumers, dead letters, and a typed
  request/reply for the navigator's retrieval queries (core NATS, outside the stream).
- `EventActor`: the loop every actor runs: `run()` -> `_loop()` -> `_once()` -> `handle_<kind>()`.
  Acks are the error policy: ack on success, nak(delay) on `Transient`, term + `dead_letter`
  on `Poison` or after `max_deliver` attempts. Handlers are idempotent by `event_id`: applied
  ids are kept in a small sqlite file per actor in the state dir.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Awaitable, Callable, TypeVar

import nats
from nats.js import api
from nats.js.errors import NotFoundError
from opentelemetry import trace
from pydantic import BaseModel, ValidationError

from actors import events
from actors.events import KINDS, DeadLetter, Event, parse_event, subject_for
from config import telemetry

M = TypeVar("M", bound=BaseModel)
HOLD = object()  # a handler returns HOLD when it acks the message itself later (e.g. the learner)


class Transient(Exception):
    """Retry later: nak with delay."""


class Poison(Exception):
    """Never retry: term and dead-letter with this reason."""


class Bus:
    def __init__(self, url: str, user: str | None = None, password: str | None = None, *, stream: str = "EVO",
                 prefix: str = "evo", producer: str = "unknown", dedup_window_s: float = 120.0, max_age_s: float = 0.0,
                 max_bytes: int = -1):
        self.url, self.user, self.password = url, user, password
        self.stream, self.prefix, self.producer = stream, prefix, producer
        self.dedup_window_s, self.max_age_s, self.max_bytes = dedup_window_s, max_age_s, max_bytes
        self.nc = None
        self.js = None

    async def connect(self, ensure_stream: bool = True, attempts: int = -1, connect_timeout: float = 2.0) -> "Bus":
        """attempts -1 (actors): never give up, also on the first connect; a command line passes a bound."""
        self.nc = await nats.connect(self.url, user=self.user, password=self.password, name=self.producer,
                                     max_reconnect_attempts=attempts, reconnect_time_wait=0.5,
                                     connect_timeout=connect_timeout)
        self.js = self.nc.jetstream()
        if ensure_stream:
            await self.ensure_stream()
        return self

    async def close(self) -> None:
        if self.nc is not None and not self.nc.is_closed:
            with contextlib.suppress(Exception):
                await self.nc.drain()

    def stream_config(self) -> api.StreamConfig:
        """One subject per known event kind (a publish to any other subject finds no stream and fails), and
        retention limits: events older than `max_age_s` or beyond `max_bytes` are discarded oldest first
        (0 / -1 = no limit)."""
        return api.StreamConfig(name=self.stream, subjects=[subject_for(k, self.prefix) for k in KINDS],
                                storage=api.StorageType.FILE, duplicate_window=self.dedup_window_s,
                                max_msg_size=8 * 1024 * 1024, max_age=self.max_age_s or None,
                                max_bytes=self.max_bytes, discard=api.DiscardPolicy.OLD)

    async def ensure_stream(self) -> None:
        """Create the stream, or bring an existing one to this configuration (subjects, limits)."""
        cfg = self.stream_config()
        try:
            info = await self.js.stream_info(self.stream)
        except NotFoundError:
            await self.js.add_stream(cfg)
            return
        have = info.config
        if (sorted(have.subjects or []) != sorted(cfg.subjects) or (have.max_bytes or -1) != cfg.max_bytes
                or abs((have.max_age or 0) - (cfg.max_age or 0)) > 1e-3):
            await self.js.update_stream(cfg)

    # ------------------------------------------------------------------ publish

    async def publish(self, event: Event, *, weights_version: str | None = None, trace_headers: dict | None = None,
                      timeout: float = 10.0) -> api.PubAck:
        """Publish one event and wait for JetStream's ack (so it is stored). `trace_headers`: the trace context
        recorded when the event was made (an outbox publishes later, outside that span)."""
        if event.producer == "unknown":
            event.producer = self.producer
        if weights_version is not None:
            event.weights_version = weights_version
        if event.trace_id is None:
            event.trace_id = telemetry.current_trace_id()
        ids = {"Nats-Msg-Id": event.event_id, "Kaizen-Kind": event.kind}
        headers = {**trace_headers, **ids} if trace_headers is not None else telemetry.inject_headers(ids)
        subject = subject_for(event, self.prefix)
        return await self.js.publish(subject, event.model_dump_json().encode(), headers=headers, timeout=timeout)

    @property
    def connected(self) -> bool:
        return self.nc is not None and self.nc.is_connected

    async def dead_letter(self, msg, consumer: str, reason: str, event_id: str | None = None) -> None:
        dl = DeadLetter(subject=msg.subject, consumer=consumer, reason=reason[:2000], original_event_id=event_id,
                        payload=msg.data[:65536].decode("utf-8", "replace"),
                        event_id=f"dl-{consumer}-{msg.metadata.sequence.stream}")
        await self.publish(dl)

    # ------------------------------------------------------------------ consume

    async def pull(self, durable: str, kinds: list[str], *, ack_wait_s: float = 60.0, max_deliver: int = 5,
                   deliver_new: bool = False):
        """A durable pull consumer filtered to `kinds`; created once, resumed after restarts."""
        subjects = [subject_for(k, self.prefix) for k in kinds]
        cfg = api.ConsumerConfig(
            durable_name=durable, ack_policy=api.AckPolicy.EXPLICIT, ack_wait=ack_wait_s, max_deliver=max_deliver + 1,
            filter_subjects=subjects, max_ack_pending=1000,
            deliver_policy=api.DeliverPolicy.NEW if deliver_new else api.DeliverPolicy.ALL,
        )
        try:
            await self.js.consumer_info(self.stream, durable)
        except NotFoundError:
            await self.js.add_consumer(self.stream, cfg)
        return await self.js.pull_subscribe_bind(durable=durable, stream=self.stream)

    async def stream_info(self):
        return await self.js.stream_info(self.stream)

    async def consumer_info(self, durable: str):
        return await self.js.consumer_info(self.stream, durable)

    # ------------------------------------------------------------------ request / reply (outside the stream)

    def rpc_subject(self, name: str) -> str:
        return f"kaizen.rpc.{self.stream.lower()}.{name}"

    async def serve_rpc(self, name: str, req_type: type[M], handler: Callable[[M], Awaitable[BaseModel]]):
        async def _cb(msg):
            try:
                reply = await handler(req_type.model_validate_json(msg.data))
                await msg.respond(reply.model_dump_json().encode())
            except Exception as exc:  # a bad query must not kill the responder
                await msg.respond(json.dumps({"error": repr(exc)[:300]}).encode())
        return await self.nc.subscribe(self.rpc_subject(name), queue=name, cb=_cb)

    async def request(self, name: str, req: BaseModel, reply_type: type[M], timeout: float = 1.0) -> M:
        msg = await self.nc.request(self.rpc_subject(name), req.model_dump_json().encode(), timeout=timeout)
        data = json.loads(msg.data)
        if isinstance(data, dict) and set(data) == {"error"}:
            raise RuntimeError(f"{name} failed remotely: {data['error']}")
        return reply_type.model_validate(data)


class AppliedIds:
    """Event ids an actor has applied, durable across restarts (sqlite in the state dir)."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(path), check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("CREATE TABLE IF NOT EXISTS applied (event_id TEXT PRIMARY KEY, at REAL)")
        self.db.commit()

    def __contains__(self, event_id: str) -> bool:
        return self.db.execute("SELECT 1 FROM applied WHERE event_id=?", (event_id,)).fetchone() is not None

    def add(self, event_id: str) -> None:
        self.db.execute("INSERT OR IGNORE INTO applied VALUES (?, ?)", (event_id, time.time()))
        self.db.commit()


class EventActor:
    """Base loop of every actor. Subclasses set `name`, `kinds`, and write `handle_<kind>()`."""

    name: str = "actor"
    kinds: tuple[str, ...] = ()
    batch: int = 8
    fetch_timeout_s: float = 1.0
    nak_delay_s: float = 2.0

    def __init__(self, settings, bus: Bus | None = None):
        self.settings = settings
        self.bus = bus
        self.stop = asyncio.Event()
        self.applied = AppliedIds(settings.state / "actors" / f"{self.name}.db")
        self.log = telemetry.log(actor=self.name)
        self.tracer = telemetry.tracer(f"kaizen.{self.name}")
        self.weights_version = "w-000000"
        self.handled = 0
        self.failures = 0
        self.last_error: str | None = None
        self._sub = None

    # -------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        """Connect, bind the durable consumer; subclasses extend (load models, open stores)."""
        if self.settings.telemetry.strict_events:
            events.strict()
        nice = self.settings.ray.actor_nice.get(self.name, 0)
        if nice > 0 and self.bus is None:  # only in its own process (a test's in-process actor keeps its priority)
            os.nice(nice)
        if self.bus is None:
            n = self.settings.nats
            self.bus = await Bus(n.url, n.user, n.password, stream=n.stream, prefix=n.subject_prefix,
                                 producer=self.name, dedup_window_s=n.dedup_window_s, max_age_s=n.max_age_days * 86400,
                                 max_bytes=n.max_bytes).connect()
        if self.kinds:
            self._sub = await self.bus.pull(self.name, list(self.kinds), ack_wait_s=self.settings.nats.ack_wait_s,
                                            max_deliver=self.settings.nats.max_deliver)

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

    async def _once(self) -> None:
        if self._sub is None:
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
        with self.tracer.start_as_current_span(f"{self.name}.handle_{event.kind}", context=ctx,
                                               kind=trace.SpanKind.CONSUMER) as span:
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
        return {"actor": self.name, "handled": self.handled, "failures": self.failures,
                "last_error": self.last_error, "weights_version": self.weights_version}


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


__all__ = ["Bus", "EventActor", "Transient", "Poison", "HOLD", "heartbeat", "AppliedIds", "KINDS"]
