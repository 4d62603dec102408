"""Where a restarted navigator resumes: the stream sequence of the last `evo.experience` applied to the pool, and
the pool's row count at that point (a pool whose count disagrees is replayed from the start or its snapshot)."""

from __future__ import annotations

import json
from pathlib import Path

from policies.weights.model_store import atomic_write_bytes


class Watermark:
    def __init__(self, path: Path):
        self.path = path

    def read(self) -> dict:
        """{"seq": ..., "rows": ...}; empty when the file is missing or unreadable."""
        try:
            m = json.loads(self.path.read_text())
            return m if isinstance(m, dict) else {}
        except (OSError, ValueError):
            return {}

    def seq(self) -> int:
        return int(self.read().get("seq", 0))

    def advance(self, seq: int, rows: int) -> None:
        """The last experience applied is at `seq` and the pool holds `rows`; never moves back."""
        if seq >= self.seq():
            atomic_write_bytes(self.path, json.dumps({"seq": seq, "rows": rows}).encode())
