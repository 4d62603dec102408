"""The experience pool: Milvus Lite (durable, written first) with an exact in-process index over the
same rows for reads. Written only by the navigator; one process opens a data dir."""
from __future__ import annotations

import json
import threading

from actors.events import RetrievedExperience
from policies.vector_index import VectorIndex

COLLECTION = "experiences"
MIN_SCORE = 0.45


class MemoryPool:
    """Milvus Lite collection (durable, written first) with an exact in-process index over the same
    rows for reads (`policies/vector_index.py`); one process opens the data dir, writes are serialised."""

    def __init__(self, path: str, dim: int):
        from pymilvus import DataType, MilvusClient

        self.client = MilvusClient(path)
        self.lock = threading.Lock()
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
        self.index = VectorIndex(dim)
        self.meta: dict[str, dict] = {}  # id -> provenance, support, state, text (mirrors the rows)
        self.load_index()

    def load_index(self) -> int:
        """Mirror every row of the collection into the in-process index (at start)."""
        it = self.client.query_iterator(COLLECTION, batch_size=4096, filter="",
                                        output_fields=["id", "vector", "text", "state", "success", "meta"])
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
            self.meta[r["id"]] = {**meta, "success": bool(r.get("success")), "state": r.get("state", "active"),
                                  "text": r.get("text", "")}

    def vector(self, exp_id: str) -> list[float] | None:
        i = self.index.row.get(exp_id)
        return None if i is None else self.index.mat[i].float().tolist()

    def search(self, vector: list[float], k: int, min_score: float = MIN_SCORE) -> list[RetrievedExperience]:
        return [RetrievedExperience(experience_id=i, text=t, score=s)
                for i, t, s in self.index.search(vector, k, min_score)]

    def search_milvus(self, vector: list[float], k: int, min_score: float = MIN_SCORE) -> list[RetrievedExperience]:
        """The same query answered by Milvus Lite itself (consistency checks, benchmarks)."""
        with self.lock:
            hits = self.client.search(COLLECTION, [vector], limit=k, filter='state == "active"',
                                      output_fields=["text"], search_params={"metric_type": "COSINE"})
        return [RetrievedExperience(experience_id=h["id"], text=h["entity"]["text"], score=float(h["distance"]))
                for h in hits[0] if float(h["distance"]) >= min_score]

    def count(self) -> int:
        with self.lock:
            res = self.client.query(COLLECTION, filter="", output_fields=["count(*)"])
        return int(res[0]["count(*)"])
