"""Navigator: the experience pool in Milvus Lite, written only here.

From each judgement it distils short natural-language experiences (what worked, what failed,
when it applies), embeds them (all-MiniLM-L6-v2) and upserts them into Milvus Lite with the
experience id as primary key, so a redelivered judgement is harmless; then emits
`evo.experience`. It answers retrieval queries over core NATS request/reply (top-k cosine above
a threshold, active experiences only) for the explorer and the Serve app.
"""
from __future__ import annotations

import asyncio
import json
import threading
import uuid

from actors.bus import EventActor
from actors.events import Experience, Judgement, RetrievedExperience, RetrieveReply, RetrieveRequest, Sample
from actors.events import parse_event, subject_for
from policies.hygiene import looks_like_injection, scrub
from policies.vector_index import VectorIndex

COLLECTION = "experiences"
MIN_SCORE = 0.45


def _calls(sample: Sample) -> list[str]:
    return [tc.name for m in sample.messages if m.role == "assistant" for tc in m.tool_calls]


def _query(sample: Sample) -> str:
    users = [m.content for m in sample.messages if m.role == "user"]
    return users[0] if users else ""


def distil(j: Judgement) -> list[Experience]:
    """One success and/or one failure experience per judged group (best and worst sample)."""
    if not j.samples:
        return []
    order = sorted(range(len(j.samples)), key=lambda i: j.outcomes[i])
    worst, best = order[0], order[-1]
    origin = "live" if j.source == "live" else "env"
    out = []
    picks = [(best, True)] if j.outcomes[best] >= 0.5 else []
    if j.outcomes[worst] < 0.5 and (not picks or worst != best):
        picks.append((worst, False))
    for i, success in picks:
        s = j.samples[i]
        raw = _query(s)
        when = scrub(raw)[:200]  # personal data never reaches memory
        calls = _calls(s)
        if success:
            how = f"calling {', '.join(calls[:6])} in that order worked" if calls else "a direct text answer worked"
            text = f"For a request like \"{when[:120]}\": {how}."
        else:
            what = f"calling {', '.join(calls[:6])}" if calls else "answering without calling any function"
            err = f" (error: {s.error[:100]})" if s.error else ""
            text = f"For a request like \"{when[:120]}\": {what} did not complete it{err}; try a different approach."
        eid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"kaizen:experience:{j.event_id}:{int(success)}"))
        state = "quarantined" if looks_like_injection(raw) or looks_like_injection(text) else "active"
        out.append(Experience(event_id=eid, experience_id=eid, text=scrub(text), when=when, success=success,
                              origin=origin, source_event_ids=[j.event_id], trace_id=j.trace_id, state=state))
    return out


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
        self.load_index()

    def load_index(self) -> int:
        """Mirror every row of the collection into the in-process index (at start)."""
        it = self.client.query_iterator(COLLECTION, batch_size=4096, filter="",
                                        output_fields=["id", "vector", "text", "state"])
        n = 0
        try:
            while True:
                rows = it.next()
                if not rows:
                    break
                self.index.upsert(rows)
                n += len(rows)
        finally:
            it.close()
        return n

    def upsert(self, rows: list[dict]) -> None:
        with self.lock:
            self.client.upsert(COLLECTION, rows)
            self.client.flush(COLLECTION)
        self.index.upsert(rows)  # only after the durable write

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


class Navigator(EventActor):
    name = "navigator"
    kinds = ("judgement",)

    async def start(self) -> None:
        await super().start()
        from policies.embedder import Embedder

        (self.settings.state / "milvus").mkdir(parents=True, exist_ok=True)
        self.embedder = await asyncio.to_thread(Embedder, self.settings.embedding.source)
        self.pool = await asyncio.to_thread(MemoryPool, str(self.settings.state / "milvus" / "experiences.db"),
                                            self.settings.embedding.dim)
        self.retrievals = 0
        self.rebuilt = await self.rebuild_if_needed()
        self._rpc = await self.bus.serve_rpc("retrieve", RetrieveRequest, self.retrieve)

    async def rebuild_if_needed(self) -> int:
        """The stream is the source of truth: if the pool holds fewer experiences than `evo.experience`
        (database deleted, or a crash between a write and its flush), replay them all (upserts by id)."""
        from nats.js import api

        subject = subject_for("experience", self.settings.nats.subject_prefix)
        info = await self.bus.js.stream_info(self.settings.nats.stream, subjects_filter=subject)
        in_stream = int((info.state.subjects or {}).get(subject, 0))
        in_pool = await asyncio.to_thread(self.pool.count)
        if in_pool >= in_stream:
            return 0
        self.log.warning("memory.rebuild", in_pool=in_pool, in_stream=in_stream)
        sub = await self.bus.js.subscribe(subject, ordered_consumer=True,
                                          config=api.ConsumerConfig(deliver_policy=api.DeliverPolicy.ALL))
        seen, batch = 0, []
        try:
            while seen < in_stream:
                try:
                    msg = await sub.next_msg(timeout=5.0)
                except (TimeoutError, asyncio.TimeoutError):
                    break
                seen += 1
                try:
                    batch.append(parse_event(msg.data))
                except Exception:
                    continue
                if len(batch) >= 256 or seen >= in_stream:
                    await self._store(batch)
                    batch = []
            if batch:
                await self._store(batch)
        finally:
            await sub.unsubscribe()
        return seen

    async def _store(self, exps: list[Experience]) -> None:
        exps = [e for e in exps if isinstance(e, Experience)]
        if not exps:
            return
        vecs = await asyncio.to_thread(self.embedder.embed, [e.text for e in exps])
        rows = [{"id": e.experience_id, "vector": v, "text": e.text, "success": e.success, "state": e.state,
                 "meta": json.dumps({"origin": e.origin, "sources": e.source_event_ids,
                                     "weights_version": e.weights_version})[:4000]}
                for e, v in zip(exps, vecs)]
        await asyncio.to_thread(self.pool.upsert, rows)

    async def retrieve(self, req: RetrieveRequest) -> RetrieveReply:
        def work():
            vec = self.embedder.embed([req.query[:2000]])[0]
            return self.pool.search(vec, max(1, min(req.k, 20)))
        found = await asyncio.to_thread(work)
        self.retrievals += 1
        return RetrieveReply(experiences=found)

    async def handle_judgement(self, j: Judgement, msg):
        exps = distil(j)
        if not exps:
            return
        for e in exps:
            e.weights_version = j.weights_version
        await self._store(exps)  # durable before the events go out and the ack
        for e in exps:
            await self.bus.publish(e, weights_version=j.weights_version)
        self.log.info("experience.stored", n=len(exps), group_id=j.group_id)

    def health(self) -> dict:
        h = super().health()
        h["retrievals"] = getattr(self, "retrievals", 0)
        return h
