"""The interactions a deployment served, by id (feedback looks them up): sqlite in the state dir."""
from __future__ import annotations

import sqlite3
import threading
import time

from actors.events import Interaction


class InteractionLog:
    """Interaction ids this deployment served (for feedback lookups); sqlite in the state dir. One connection
    shared by the request threads, so every use holds the lock (concurrent answers of one batch finish
    together; unlocked, sqlite says "cannot start a transaction within a transaction")."""

    def __init__(self, path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(path), check_same_thread=False, timeout=10)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("CREATE TABLE IF NOT EXISTS interactions (id TEXT PRIMARY KEY, event TEXT, at REAL)")
        self.db.commit()
        self.lock = threading.Lock()

    def put(self, ev: Interaction) -> None:
        with self.lock:
            self.db.execute("INSERT OR REPLACE INTO interactions VALUES (?, ?, ?)",
                            (ev.interaction_id, ev.model_dump_json(), time.time()))
            self.db.commit()

    def get(self, interaction_id: str) -> Interaction | None:
        with self.lock:
            row = self.db.execute("SELECT event FROM interactions WHERE id=?", (interaction_id,)).fetchone()
        return Interaction.model_validate_json(row[0]) if row else None
