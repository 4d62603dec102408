"""The experience pool: Milvus Lite (durable, written first) with an exact in-process index over the
same rows for reads. Written only by the navigator; one process opens a data dir."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time

from actors.events import RetrievedExperience
from policies.memory.vector_index import VectorIndex

COLLECTION = "experiences"
MIN_SCORE = 0.45


def is_server(path: str) -> bool:
    return path.startswith(("http://", "https://", "tcp://", "unix:"))


def release_lite(client, path: str) -> None:
    """Close a Milvus Lite client and stop the in-process server behind its path. `client.close()` alone
    leaves that server (and its open files) running until the process exits; this closes the database
    cleanly, so the next open, in this process or another, reads complete files."""
    with contextlib.suppress(Exception):
        client.close()
    if is_server(path):
        return
    from milvus_lite.server_manager import server_manager_instance

    server_manager_instance.release_server(path)


class MemoryPool:
    """Milvus Lite collection (durable, written first) with an exact in-process index over the same
    rows for reads (`policies/memory/vector_index.py`); one process opens the data dir, writes are serialised."""

    def __init__(self, path: str, dim: int, token: str | None = None):
        """`path`: a Milvus Lite file, or a Milvus server's URI (http://host:19530)."""
        from pymilvus import MilvusClient

        self.path = path
        self.client = MilvusClient(path, token=token or "")  # Lite: fails while another process holds the data dir
        self.lock = threading.Lock()
        self.index = VectorIndex(dim)
        self.meta: dict[str, dict] = {}  # id -> provenance, support, state, text (mirrors the rows)
        try:
            self._open(dim)
            self.load_index()
        except Exception:
            release_lite(self.client, path)
            raise

    @classmethod
    def open(cls, path: str, dim: int, token: str | None = None) -> tuple["MemoryPool", str | None]:
        """Open the pool; a database that opens but cannot be read (a write cut off by a kill: Milvus Lite
        keeps writing after flush()) is moved aside and replaced by an empty one, which the navigator
        then rebuilds from the stream. Returns (pool, why it was replaced or None)."""
        from pymilvus.exceptions import MilvusException

        try:
            return cls(path, dim, token), None
        except MilvusException as exc:
            if "Open local milvus failed" in str(exc) or is_server(path):  # locked by a live process; a server's
                raise  # errors are the server's
            aside = f"{path}.unreadable-{int(time.time())}"
            os.replace(path, aside)  # kept for inspection
            return cls(path, dim), f"{str(exc)[:300]}; moved to {aside}"

    def close(self) -> None:
        with self.lock:
            release_lite(self.client, self.path)

    def _open(self, dim: int) -> None:
        from pymilvus import DataType

        if not self.client.has_collection(COLLECTION):
            schema = self.client.create_schema(auto_id=False, enable_dynamic_field=False)
            schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=64)
            schema.add_field("vector", DataType.FLOAT_VECTOR, dim=dim)
            schema.add_field("text", DataType.VARCHAR, max_length=2048)
            schema.add_field("success", DataType.BOOL)
            schema.add_field("state", DataType.VARCHAR, max_length=16)
            schema.add_field("meta", DataType.VARCHAR, max_length=4096)
            index = self.client.prepare_index_params()
            index.add_index("vector", index_type="FLAT", metric_type="COSINE")
            self.client.create_collection(COLLECTION, schema=schema, index_params=index)
        self.client.load_collection(COLLECTION)

    def load_index(self) -> int:
        """Mirror every row of the collection into the in-process index (at start)."""
        it = self.client.query_iterator(
            COLLECTION, batch_size=4096, filter="", output_fields=["id", "vector", "text", "state", "success", "meta"]
        )
        n = 0
        try:
            while True:
                rows = it.next()
                if not rows:
                    break
                self.index.upsert(rows)
                self._remember(rows)
                n += len(rows)
        finally:
            it.close()
        return n

    def upsert(self, rows: list[dict]) -> None:
        with self.lock:
            self.client.upsert(COLLECTION, rows)
            self.client.flush(COLLECTION)
        self.index.upsert(rows)  # only after the durable write
        self._remember(rows)

    def _remember(self, rows: list[dict]) -> None:
        for r in rows:
            try:
                meta = json.loads(r.get("meta") or "{}")
            except ValueError:
                meta = {}
            self.meta[r["id"]] = {
                **meta,
                "success": bool(r.get("success")),
                "state": r.get("state", "active"),
                "text": r.get("text", ""),
            }

    def rows(self) -> list[dict]:
        """Every row as stored (vectors from the in-process mirror)."""
        out = []
        for exp_id, m in self.meta.items():
            meta = {k: v for k, v in m.items() if k not in ("success", "state", "text")}
            out.append(
                {
                    "id": exp_id,
                    "vector": self.vector(exp_id),
                    "text": m["text"],
                    "success": m["success"],
                    "state": m["state"],
                    "meta": json.dumps(meta)[:4000],
                }
            )
        return out

    def snapshot(self, path, seq: int) -> int:
        """Write every row and the stream sequence they reflect (JSON lines, atomically); returns rows written.
        With a retention limit on the stream, the snapshot plus the events after `seq` rebuild the pool."""
        from policies.weights.model_store import atomic_write_bytes

        rows = self.rows()
        lines = [json.dumps({"seq": seq, "rows": len(rows)})] + [json.dumps(r) for r in rows]
        atomic_write_bytes(path, ("\n".join(lines) + "\n").encode())
        return len(rows)

    def restore(self, path) -> int | None:
        """Upsert the rows of a snapshot; returns its stream sequence (None when there is no readable one)."""
        try:
            lines = open(path, encoding="utf-8").read().splitlines()
            head, rows = json.loads(lines[0]), [json.loads(x) for x in lines[1:] if x]
        except (OSError, ValueError, IndexError):
            return None
        if head.get("rows") != len(rows):  # cut short: not a snapshot
            return None
        for i in range(0, len(rows), 1024):
            self.upsert(rows[i : i + 1024])
        return int(head["seq"])

    def vector(self, exp_id: str) -> list[float] | None:
        i = self.index.row.get(exp_id)
        return None if i is None else self.index.mat[i].float().tolist()

    def search(self, vector: list[float], k: int, min_score: float = MIN_SCORE) -> list[RetrievedExperience]:
        return [RetrievedExperience(experience_id=i, text=t, score=s) for i, t, s in self.index.search(vector, k, min_score)]

    def search_milvus(self, vector: list[float], k: int, min_score: float = MIN_SCORE) -> list[RetrievedExperience]:
        """The same query answered by Milvus Lite itself (consistency checks, benchmarks)."""
        with self.lock:
            hits = self.client.search(
                COLLECTION,
                [vector],
                limit=k,
                filter='state == "active"',
                output_fields=["text"],
                search_params={"metric_type": "COSINE"},
            )
        return [
            RetrievedExperience(experience_id=h["id"], text=h["entity"]["text"], score=float(h["distance"]))
            for h in hits[0]
            if float(h["distance"]) >= min_score
        ]

    def count(self) -> int:
        with self.lock:
            res = self.client.query(COLLECTION, filter="", output_fields=["count(*)"])
        return int(res[0]["count(*)"])
