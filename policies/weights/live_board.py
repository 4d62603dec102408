"""The LIVE pointer on the bus: one key in a JetStream key-value bucket, so a replica on any node follows it.

The broadcaster is the only writer (`LivePolicy.announce`): it puts the pointer in the bucket, then keeps it as its
node's copy, then publishes the event that announces it. Every follower (serve replicas, any role's `LivePolicy`)
watches the key with the bucket's own watch (an ordered consumer that re-creates itself after an outage), follows
each value in order (`LivePolicy.watch`), and writes it as its node's copy in its own state dir unless the copy is
newer by the writer's clock (`WeightsStore.keep_live`; the followers on the broadcaster's node share its file): a
replica that starts while the bus is down serves the version users were given (DESIGN.md "What is live").

The bucket is named after the stream (`<stream>_live`: a deployment's stream and its pointer go together) and has
the stream's replicas (`nats.replicas`). It keeps the last few values, so `nats kv history` shows recent moves.
"""

from __future__ import annotations

import contextlib
from typing import Awaitable, Callable

from nats.js import api
from nats.js.errors import BadRequestError, BucketNotFoundError, KeyNotFoundError, ServerError

from actors.lifecycles import LivePointer
from policies.weights.model_store import WeightsStore

KEY = "pointer"
HISTORY = 8


async def open_bucket(open_existing, create):
    """Bind a bucket, creating it when it does not exist yet; two processes that create it at once both end up
    bound to the one that won."""
    try:
        return await open_existing()
    except BucketNotFoundError:
        pass
    try:
        return await create()
    except (BadRequestError, ServerError):  # created meanwhile by another process
        return await open_existing()


class LiveBoard:
    def __init__(self, settings, store: WeightsStore, log=None):
        self.bucket = f"{settings.nats.stream}_live"
        self.replicas = settings.nats.replicas
        self.store, self.log = store, log
        self.kv = None
        self.revision = 0  # of the last value seen

    async def open(self, js) -> "LiveBoard":
        self.kv = await open_bucket(
            lambda: js.key_value(self.bucket),
            lambda: js.create_key_value(
                bucket=self.bucket,
                history=HISTORY,
                replicas=self.replicas,
                storage=api.StorageType.FILE,
                description="Kaizen: the weights every replica serves (LivePointer JSON)",
            ),
        )
        return self

    async def get(self) -> LivePointer | None:
        try:
            entry = await self.kv.get(KEY)
        except KeyNotFoundError:
            return None
        return LivePointer.model_validate_json(entry.value)

    async def put(self, ptr: LivePointer) -> int:
        self.revision = await self.kv.put(KEY, ptr.model_dump_json().encode())
        return self.revision

    async def watch(self, on_change: Callable[[LivePointer], Awaitable[None]] | None = None) -> None:
        """Follow the key until cancelled: each new value becomes this node's copy, then `on_change` runs (its
        failure is logged; the next value comes anyway). The first value is the current one."""
        watcher = await self.kv.watch(KEY)
        try:
            async for entry in watcher:
                if entry is None or not entry.value or entry.operation is not None:  # end of the initial values
                    continue
                try:
                    ptr = LivePointer.model_validate_json(entry.value)
                except ValueError:
                    if self.log:
                        self.log.error("live.pointer_unreadable", revision=entry.revision)
                    continue
                self.revision = entry.revision
                try:
                    self.store.keep_live(ptr)
                except OSError as exc:  # the copy is for a start without the bus: following goes on
                    if self.log:
                        self.log.error("live.copy_failed", version=ptr.version, error=repr(exc)[:200])
                if on_change is not None:
                    try:
                        await on_change(ptr)
                    except Exception:
                        if self.log:
                            self.log.exception("live.follow_failed", version=ptr.version)
        finally:
            with contextlib.suppress(Exception):  # the connection may be gone already
                await watcher.stop()
