"""A replica's durable outbox: interactions and feedback reach the stream even while the bus is down.

The request path only writes the event to sqlite in the state dir (milliseconds) and wakes the
drainer; the drainer publishes pending events in order and deletes each once JetStream acked it.
While nats-server is down (killed, restarting) events wait here and chat answers at normal speed;
on reconnect they drain. Nothing is lost (the row goes only after the ack) and nothing is doubled:
the event id is the Nats-Msg-Id, so a publish repeated after a lost ack is dropped by JetStream's
duplicate window, and handlers skip ids they applied. All replicas on a node share the file, so a
replica that is gone leaves nothing behind: any live one drains it.

It is also the only store serve keeps for interactions: feedback finds one here while it is pending (`get`, by
event id), and on the stream once it went (`serve/feedback.py`).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
from pathlib import Path

from actors.events import parse_event


class Outbox:
    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(path), check_same_thread=False, timeout=10)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS outbox (seq INTEGER PRIMARY KEY AUTOINCREMENT, event_id TEXT UNIQUE, "
            "event TEXT, headers TEXT, at REAL)"
        )
        self.db.commit()
        self.lock = threading.Lock()
        self.wake: asyncio.Event | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.published = self.failed_rounds = 0
        self.last_error = ""

    def put(self, event, trace_headers: dict | None = None) -> None:
        """Durable before it returns; the same event id twice is kept once."""
        with self.lock:
            self.db.execute(
                "INSERT OR IGNORE INTO outbox (event_id, event, headers, at) VALUES (?, ?, ?, ?)",
                (event.event_id, event.model_dump_json(), json.dumps(trace_headers or {}), time.time()),
            )
            self.db.commit()
        if self.loop is not None:  # put runs on a worker thread; the drainer waits on the event loop
            self.loop.call_soon_threadsafe(self.wake.set)

    def pending(self, limit: int = 100) -> list[tuple[int, object, dict]]:
        with self.lock:
            rows = self.db.execute("SELECT seq, event, headers FROM outbox ORDER BY seq LIMIT ?", (limit,)).fetchall()
        return [(seq, parse_event(ev), json.loads(h)) for seq, ev, h in rows]

    def get(self, event_id: str):
        """The pending event with this id, or None (never put here, or published and gone)."""
        with self.lock:
            row = self.db.execute("SELECT event FROM outbox WHERE event_id=?", (event_id,)).fetchone()
        return parse_event(row[0]) if row else None

    def done(self, seq: int) -> None:
        with self.lock:
            self.db.execute("DELETE FROM outbox WHERE seq=?", (seq,))
            self.db.commit()

    def size(self) -> int:
        with self.lock:
            return int(self.db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0])

    async def drain_once(self, bus, timeout_s: float = 2.0) -> int:
        """Publish what is pending, oldest first, until empty or the bus fails; returns how many went."""
        sent = 0
        while rows := await asyncio.to_thread(self.pending):
            for seq, ev, headers in rows:
                try:
                    await bus.publish(ev, trace_headers=headers or None, timeout=timeout_s)
                except Exception as exc:  # down or reconnecting: keep it, try again later
                    self.failed_rounds += 1
                    self.last_error = repr(exc)[:200]
                    return sent
                await asyncio.to_thread(self.done, seq)
                sent += 1
                self.published += 1
        return sent

    async def run(self, bus_factory, log, every_s: float = 1.0) -> None:
        """Drain on every put and at least every `every_s` (the bus may come back without a put)."""
        self.wake, self.loop = asyncio.Event(), asyncio.get_running_loop()
        while True:
            try:
                await asyncio.wait_for(self.wake.wait(), timeout=every_s)
            except asyncio.TimeoutError:
                pass
            self.wake.clear()
            try:
                bus = await bus_factory()
                if bus.connected:
                    await self.drain_once(bus)
            except Exception as exc:  # noqa: BLE001 - never let the drainer die
                self.last_error = repr(exc)[:200]
                log.warning("outbox.drain_failed", error=self.last_error, pending=self.size())
