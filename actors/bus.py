"""JetStream plumbing shared by every actor and the Serve app.

- `Bus`: connect, ensure the `EVO` stream, publish typed events (event_id doubles as
  `Nats-Msg-Id`, trace context in headers), durable pull consumers, dead letters, and a typed
  request/reply for the navigator's retrieval queries (core NATS, outside the stream).
- `Bus.interaction(id)`: one stored interaction by id, for feedback (serve, attributor, navigator). Each
  interaction has its own subject (`evo.interaction.<id>`, `actors/events.py`), and JetStream's get-last-message-
  by-subject answers from the stream's subject index: no scan, and its cost does not grow with the stream. This
  is how JetStream's own key-value buckets find a key (one subject per key); a bucket of interactions would have
  been a second copy of every one on the bus, while here the event the actors read is the record. The index
  holds one entry per stored interaction, so the stream's retention (`max_age_s`, `max_bytes`) bounds it. It is
  asked of the stream leader ($JS.API.STREAM.MSG.GET), not as a direct get (`allow_direct` lets any replica
  answer, one that may not have applied the latest publish yet), so an interaction whose publish JetStream acked
  (after which serve's outbox forgets it) is found at once.
The loop every actor runs on top of it is `actors/actor.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Awaitable, Callable, TypeVar

import nats
from nats.js import api
from nats.js.errors import NotFoundError, ServerError
from pydantic import BaseModel

from actors.events import KINDS, DeadLetter, Interaction, kind_of, parse_event, subject_for, subjects_of
from actors.messages import Event
from config import telemetry
from config.settings import MAX_ACK_PENDING

M = TypeVar("M", bound=BaseModel)


class Transient(Exception):
    """Retry later: nak with delay."""


class Poison(Exception):
    """Never retry: term and dead-letter with this reason."""


class Bus:
    def __init__(
        self,
        url: str,
        user: str | None = None,
        password: str | None = None,
        *,
        stream: str = "EVO",
        prefix: str = "evo",
        producer: str = "unknown",
        dedup_window_s: float = 120.0,
        max_age_s: float = 0.0,
        max_bytes: int = -1,
        replicas: int = 1,
    ):
        self.url, self.user, self.password = url, user, password
        self.stream, self.prefix, self.producer = stream, prefix, producer
        self.dedup_window_s, self.max_age_s, self.max_bytes, self.replicas = dedup_window_s, max_age_s, max_bytes, replicas
        self.nc = None
        self.js = None

    @classmethod
    def from_settings(
        cls, n, producer: str, url: str | None = None, user: str | None = None, password: str | None = None
    ) -> "Bus":
        """The deployment's bus as `settings.nats` (`n`) describes it: stream, subjects and limits. A command line
        passes the url, user and password that `up` wrote down."""
        return cls(
            url or n.url,
            user or n.user,
            n.password if password is None else password,
            stream=n.stream,
            prefix=n.subject_prefix,
            producer=producer,
            dedup_window_s=n.dedup_window_s,
            max_age_s=n.max_age_days * 86400,
            max_bytes=n.max_bytes,
            replicas=n.replicas,
        )

    async def connect(self, ensure_stream: bool = True, attempts: int = -1, connect_timeout: float = 2.0) -> "Bus":
        """attempts -1 (actors): never give up, also on the first connect; a command line passes a bound."""
        self.nc = await nats.connect(
            self.url,
            user=self.user,
            password=self.password,
            name=self.producer,
            max_reconnect_attempts=attempts,
            reconnect_time_wait=0.5,
            connect_timeout=connect_timeout,
        )
        self.js = self.nc.jetstream()
        if ensure_stream:
            await self.ensure_stream()
        return self

    async def close(self) -> None:
        if self.nc is not None and not self.nc.is_closed:
            with contextlib.suppress(Exception):
                await self.nc.drain()

    def stream_config(self) -> api.StreamConfig:
        """The subjects of every known event kind (a publish to any other subject finds no stream and fails), and
        retention limits: events older than `max_age_s` or beyond `max_bytes` are discarded oldest first
        (0 / -1 = no limit)."""
        return api.StreamConfig(
            name=self.stream,
            subjects=[s for k in KINDS for s in subjects_of(k, self.prefix)],
            storage=api.StorageType.FILE,
            duplicate_window=self.dedup_window_s,
            max_msg_size=8 * 1024 * 1024,
            max_age=self.max_age_s or None,
            max_bytes=self.max_bytes,
            discard=api.DiscardPolicy.OLD,
            num_replicas=self.replicas,
        )

    async def ensure_stream(self) -> None:
        """Create the stream, or bring an existing one to this configuration (subjects, limits): a stream made by
        an earlier release gains the per-interaction subjects; its stored events stay where they are."""
        cfg = self.stream_config()
        try:
            try:
                info = await self.js.stream_info(self.stream)
            except NotFoundError:
                await self.js.add_stream(cfg)
                return
            have = info.config
            if (
                sorted(have.subjects or []) != sorted(cfg.subjects)
                or (have.max_bytes or -1) != cfg.max_bytes
                or abs((have.max_age or 0) - (cfg.max_age or 0)) > 1e-3
                or (have.num_replicas or 1) != self.replicas
            ):
                await self.js.update_stream(cfg)
        except ServerError as exc:
            if exc.err_code == 10047:  # JetStream reserves max_bytes on the store's disk up front
                raise RuntimeError(
                    f"nats-server cannot reserve {cfg.max_bytes} bytes for stream {self.stream} on the "
                    "disk of its store: free disk space or lower nats.max_bytes"
                ) from exc
            raise

    # ------------------------------------------------------------------ publish

    async def publish(
        self, event: Event, *, weights_version: str | None = None, trace_headers: dict | None = None, timeout: float = 10.0
    ) -> api.PubAck:
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
        dl = DeadLetter(
            subject=msg.subject,
            consumer=consumer,
            reason=reason[:2000],
            original_event_id=event_id,
            payload=msg.data[:65536].decode("utf-8", "replace"),
            event_id=f"dl-{consumer}-{msg.metadata.sequence.stream}",
        )
        await self.publish(dl)

    # ------------------------------------------------------------------ consume

    async def pull(
        self, durable: str, kinds: list[str], *, ack_wait_s: float = 60.0, max_deliver: int = 5, deliver_new: bool = False
    ):
        """A durable pull consumer filtered to `kinds`; created once, resumed after restarts."""
        subjects = [s for k in kinds for s in subjects_of(k, self.prefix)]
        cfg = api.ConsumerConfig(
            durable_name=durable,
            ack_policy=api.AckPolicy.EXPLICIT,
            ack_wait=ack_wait_s,
            max_deliver=max_deliver + 1,
            filter_subjects=subjects,
            max_ack_pending=MAX_ACK_PENDING,
            deliver_policy=api.DeliverPolicy.NEW if deliver_new else api.DeliverPolicy.ALL,
        )
        try:
            info = await self.js.consumer_info(self.stream, durable)
            have = set(info.config.filter_subjects or [info.config.filter_subject or ""])
            if have != set(subjects):  # a release that reads more kinds: the durable keeps its place, new filter
                await self.js.add_consumer(self.stream, cfg)
        except NotFoundError:
            await self.js.add_consumer(self.stream, cfg)
        return await self.js.pull_subscribe_bind(durable=durable, stream=self.stream)

    async def stored_since(self, seq: int, limit: int, kinds=None) -> tuple[list[tuple[str, bytes]], int]:
        """Up to `limit` stored events after stream sequence `seq`, in stream order, as (subject, JSON) of the
        `kinds` asked (all when None), and the last sequence read: pass it back to read on. An ordered consumer
        that lives for one call; events that retention already dropped are skipped."""
        state = (await self.js.stream_info(self.stream)).state
        last = int(state.last_seq)
        if last <= seq or not state.messages:  # nothing new, or retention emptied the stream
            return [], max(seq, last)
        want = None if kinds is None else set(kinds)
        cfg = api.ConsumerConfig(deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=seq + 1)
        sub = await self.js.subscribe(f"{self.prefix}.>", ordered_consumer=True, config=cfg)
        out, at, read = [], seq, 0
        try:
            while at < last and read < limit:
                try:
                    msg = await sub.next_msg(timeout=5.0)
                except TimeoutError:
                    break
                at, read = msg.metadata.sequence.stream, read + 1
                if want is None or kind_of(msg.subject, self.prefix) in want:
                    out.append((msg.subject, msg.data))
        finally:
            await sub.unsubscribe()
        return out, at

    async def interaction(self, interaction_id: str, timeout: float = 3.0) -> Interaction | None:
        """The stored interaction with this id, or None (never served, or dropped by retention); raises when the
        bus does not answer within `timeout` seconds (see the module docstring)."""
        try:
            subject = subject_for("interaction", self.prefix, key=interaction_id)
        except ValueError:  # not one subject token: no interaction of ours has this id
            return None
        try:
            msg = await asyncio.wait_for(self.js.get_last_msg(self.stream, subject), timeout)
        except NotFoundError:
            return None
        ev = parse_event(msg.data)
        return ev if isinstance(ev, Interaction) else None

    async def stream_info(self):
        return await self.js.stream_info(self.stream)

    async def consumer_info(self, durable: str):
        return await self.js.consumer_info(self.stream, durable)

    async def backlog(self, durable: str) -> int:
        """Messages a durable consumer has yet to finish (pending + unacked); 0 before it has bound (any other
        error, the bus down say, is the caller's)."""
        try:
            info = await self.consumer_info(durable)
        except NotFoundError:
            return 0
        return int(info.num_pending) + int(info.num_ack_pending)

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


__all__ = ["Bus", "Transient", "Poison", "KINDS"]
