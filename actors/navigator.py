"""Navigator: the experience pool in Milvus Lite, written only here.

From each judgement it distils short natural-language experiences (what worked, what failed,
when it applies) with provenance (origin, hashed user, weights version, source event ids),
embeds them (all-MiniLM-L6-v2) and upserts them into Milvus Lite with the experience id as
primary key, so a redelivered judgement is harmless; then emits `evo.experience`. Every later
change of an experience is another `evo.experience` with the same id (upsert), so replaying the
stream rebuilds the pool exactly; a watermark (the stream sequence of the last experience applied,
`policies/memory/watermark.py`) says where a restarted navigator resumes, and an empty or missing database
replays all.

Hygiene: personal data is scrubbed before storage; instruction-like text is stored quarantined
and never retrieved; a new experience within `memory.merge_threshold` cosine of an active one with
the same verdict is merged into it (support + 1) instead of added; each user's live
contributions are capped (the oldest retires); utility is tracked (an experience is "used" when
it guided a rollout or was in a live request's context, and "helped" when the guided samples beat
the unguided ones of their group, or the user's feedback was positive) and experiences that do
not help retire, as do the least valuable ones past `memory.max_active`. Retrieval answers over
core NATS request/reply from the in-process index: top-k cosine above a threshold, active only,
ranked by cosine x age decay x utility. Experiences are indexed by the request they apply to
(`retrieval_key`), so a similar request finds them whatever their advice says.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

from actors.actor import EventActor
from actors.events import Experience, Feedback, Judgement, RetrieveReply, RetrieveRequest, derived_id, parse_event, subject_for
from policies.memory.experience import decay, distil, from_row, guided_helped, retrieval_key, to_row, utility
from policies.memory.pool import MemoryPool
from policies.memory.watermark import Watermark
from policies.weights.model_store import atomic_write_bytes


class Navigator(EventActor):
    name = "navigator"
    kinds = ("judgement", "feedback")

    async def start(self) -> None:
        await super().start()
        import torch

        from policies.memory.embedder import Embedder

        # Every torch call (embeddings, index search and upserts) runs on one dedicated thread: OpenMP
        # keeps a thread team per calling thread, and once a second thread has run torch ops, queries
        # on either slow down for good (measured: 12-13 ms -> 18-21 ms per query embedding).
        threads = max(1, self.settings.memory.search_threads)
        self._torch = ThreadPoolExecutor(
            1, thread_name_prefix="navigator-torch", initializer=torch.set_num_threads, initargs=(threads,)
        )
        d = self.settings.state / "milvus"
        d.mkdir(parents=True, exist_ok=True)
        self.embedder = await self._on_torch(Embedder, self.settings.embedding.source, self.settings.embedding.dtype)
        m = self.settings.memory  # a Milvus server when memory.uri is set, else Milvus Lite in the state dir
        self.pool, replaced = await self._on_torch(
            MemoryPool.open, m.uri or str(d / "experiences.db"), self.settings.embedding.dim, m.token
        )
        if replaced:  # the replay below rebuilds it from the stream
            self.log.warning("memory.unreadable_pool_replaced", error=replaced)
        self.watermark = Watermark(d / "applied_seq")
        self.utility_file, self.snapshot_file = d / "utility.json", d / "snapshot.jsonl"
        self._snap_seq, self._last_snap = 0, time.monotonic()
        self.uses: dict[str, list[int]] = json.loads(self.utility_file.read_text()) if self.utility_file.exists() else {}
        self._dirty, self._last_sweep = False, 0.0
        self.retrievals = self.merged = self.retired = 0
        self._query_vecs: OrderedDict[str, list[float]] = OrderedDict()  # recent query embeddings (LRU)
        self.rebuilt = await self.rebuild_if_needed()
        self._rpc = await self.bus.serve_rpc("retrieve", RetrieveRequest, self.retrieve)

    async def _on_torch(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._torch, fn, *args)

    # ------------------------------------------------------------------ stream <-> pool
    def _advance(self, seq: int) -> None:
        self.watermark.advance(seq, len(self.pool.meta))

    async def rebuild_if_needed(self) -> int:
        """Apply every `evo.experience` after the watermark (all of them when the pool is empty or the
        watermark is missing): upserts by id, so replaying one twice is harmless. Returns the count."""
        from nats.js import api

        subject = subject_for("experience", self.settings.nats.subject_prefix)
        info = await self.bus.js.stream_info(self.settings.nats.stream, subjects_filter=subject)
        in_stream = int((info.state.subjects or {}).get(subject, 0))
        last = int(info.state.last_seq)
        mark = self.watermark.read()
        consistent = bool(self.pool.index.ids) and mark.get("rows") == len(self.pool.meta)
        start = int(mark.get("seq", 0)) if consistent else 0  # missing or inconsistent pool: replay everything
        if not consistent and (snap := await self._on_torch(self.pool.restore, self.snapshot_file)) is not None:
            start = snap  # the snapshot holds what retention may have dropped from the stream
            self._advance(snap)
            self.log.warning("memory.restored_snapshot", seq=snap, rows=len(self.pool.meta))
        if int(info.state.first_seq) > start + 1 and in_stream:
            self.log.warning(
                "memory.replay_gap",
                after_seq=start,
                first_in_stream=int(info.state.first_seq),
                note="events in between left the stream (retention) before a snapshot held them",
            )
        if in_stream == 0 or start >= last:
            return 0
        self.log.warning("memory.replay", from_seq=start + 1, in_pool=len(self.pool.index), in_stream=in_stream)
        cfg = api.ConsumerConfig(deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start + 1)
        sub = await self.bus.js.subscribe(subject, ordered_consumer=True, config=cfg)
        seen, batch, seq = 0, [], start
        try:
            while seq < last:
                try:
                    msg = await sub.next_msg(timeout=3.0)
                except (TimeoutError, asyncio.TimeoutError):
                    break
                seen, seq = seen + 1, msg.metadata.sequence.stream
                try:
                    batch.append(parse_event(msg.data))
                except Exception:
                    continue
                if len(batch) >= 256:
                    await self._store(batch)
                    self._advance(seq)
                    batch = []
            if batch:
                await self._store(batch)
            self._advance(seq)
        finally:
            await sub.unsubscribe()
        return seen

    async def _store(self, exps: list[Experience], vecs: list[list[float]] | None = None) -> None:
        exps = [e for e in exps if isinstance(e, Experience)]
        if not exps:
            return
        if vecs is None:
            vecs = await self._on_torch(self.embedder.embed, [retrieval_key(e) for e in exps])
        await self._on_torch(self.pool.upsert, [to_row(e, v) for e, v in zip(exps, vecs)])

    async def _write(self, exps: list[Experience], vecs: list[list[float]] | None = None) -> None:
        """Durable in the pool first, then on the stream; the watermark follows the stream."""
        await self._store(exps, vecs)
        for e in exps:
            ack = await self.bus.publish(e, weights_version=e.weights_version)
            self._advance(int(ack.seq))

    # ------------------------------------------------------------------ changes of existing experiences
    def _changed(self, exp_id: str, event_id: str, **update) -> Experience:
        return from_row(exp_id, self.pool.meta[exp_id], event_id, **update)

    async def _retire(self, exp_id: str, reason: str, cause: str) -> None:
        ev = self._changed(exp_id, derived_id("retire", f"{exp_id}:{cause}"), state="retired", reason=reason)
        await self._write([ev], [await self._on_torch(self.pool.vector, exp_id)])
        self.retired += 1
        self.log.info("experience.retired", experience_id=exp_id, reason=reason)

    def _near_duplicate(self, vec: list[float], success: bool) -> tuple[str, float] | None:
        for i, _, score in self.pool.index.search(vec, 5, self.settings.memory.merge_threshold):
            if self.pool.meta.get(i, {}).get("success") == success:
                return i, score
        return None

    # ------------------------------------------------------------------ handlers
    async def handle_judgement(self, j: Judgement, msg):
        for exp_id, helped in guided_helped(j).items():
            self._use(exp_id, helped)
        exps = distil(j)
        if not exps:
            return
        vecs = await self._on_torch(self.embedder.embed, [retrieval_key(e) for e in exps])
        for e, v in zip(exps, vecs):
            near = await self._on_torch(self._near_duplicate, v, e.success) if e.state == "active" else None
            if near and near[0] != e.experience_id:
                m = self.pool.meta[near[0]]
                if j.event_id in m.get("sources", []):  # redelivered after the merge was written
                    continue
                merged = self._changed(
                    near[0],
                    derived_id("merge", e.event_id),
                    support=m.get("support", 1) + 1,
                    source_event_ids=(m.get("sources", []) + e.source_event_ids)[-20:],
                    reason=f"merged a near-duplicate (cosine {near[1]:.3f}) from {j.event_id}",
                )
                await self._write([merged], [await self._on_torch(self.pool.vector, near[0])])
                self.merged += 1
                continue
            await self._write([e], [v])
            if e.user_hash and e.state == "active":
                await self._cap_user(e.user_hash)
        self.log.info("experience.stored", n=len(exps), group_id=j.group_id)

    async def _cap_user(self, user: str) -> None:
        mine = sorted(
            (m.get("created_at") or "", i)
            for i, m in self.pool.meta.items()
            if m.get("user_hash") == user and m["state"] == "active"
        )
        for _, exp_id in mine[: max(0, len(mine) - self.settings.memory.per_user_cap)]:
            await self._retire(exp_id, f"per-user cap of {self.settings.memory.per_user_cap} active experiences", f"cap:{user}")

    async def handle_feedback(self, fb: Feedback, msg):
        """Count a use of each experience the rated request had in context; the interaction is looked up on the
        stream by id (events of earlier releases carry it). Gone from the stream: nothing to count."""
        it = fb.interaction or await self.bus.interaction(fb.interaction_id)
        for exp_id in it.experience_ids if it is not None else []:
            self._use(exp_id, fb.score > 0)

    def _use(self, exp_id: str, helped: bool) -> None:
        u = self.uses.setdefault(exp_id, [0, 0])
        u[0] += 1
        u[1] += int(helped)
        self._dirty = True

    async def tick(self) -> None:
        now = time.monotonic()
        if self._dirty:
            self._dirty = False
            atomic_write_bytes(self.utility_file, json.dumps(self.uses).encode())
        if now - self._last_snap > self.settings.memory.snapshot_every_s and self.watermark.seq() > self._snap_seq:
            await self._snapshot()
        if now - self._last_sweep < 30:
            return
        self._last_sweep = now
        await self.sweep()

    async def _snapshot(self) -> None:
        seq = self.watermark.seq()
        n = await self._on_torch(self.pool.snapshot, self.snapshot_file, seq)
        self._snap_seq, self._last_snap = seq, time.monotonic()
        self.log.info("memory.snapshot", seq=seq, rows=n)

    async def sweep(self) -> int:
        """Retire experiences that did not help, then the least valuable beyond `memory.max_active`."""
        mem, n = self.settings.memory, 0
        for exp_id, (uses, helped) in list(self.uses.items()):
            m = self.pool.meta.get(exp_id)
            if m and m["state"] == "active" and uses >= mem.min_uses and utility(uses, helped) < mem.min_utility:
                await self._retire(exp_id, f"did not help: {helped} of {uses} uses", "utility")
                n += 1
        active = [i for i, m in self.pool.meta.items() if m["state"] == "active"]
        if len(active) > mem.max_active:
            worst = sorted(active, key=self._value)[: len(active) - mem.max_active]
            for exp_id in worst:
                await self._retire(exp_id, f"pool above {mem.max_active} active experiences; least valuable", "capacity")
                n += 1
        return n

    def _value(self, exp_id: str) -> float:
        uses, helped = self.uses.get(exp_id, (0, 0))
        created = self.pool.meta.get(exp_id, {}).get("created_at")
        return decay(created, self.settings.memory.half_life_days) * (0.5 + utility(uses, helped))

    async def retrieve(self, req: RetrieveRequest) -> RetrieveReply:
        k = max(1, min(req.k, 20))

        def work():
            t0 = time.perf_counter()
            q = req.query[:2000]
            vec = self._query_vecs.get(q)
            if vec is None:  # an agent's tool loop repeats the same user message request after request
                vec = self._query_vecs[q] = self.embedder.embed([q])[0]
                if len(self._query_vecs) > 1024:
                    self._query_vecs.popitem(last=False)
            else:
                self._query_vecs.move_to_end(q)
            hits = self.pool.search(vec, 4 * k, self.settings.memory.min_score)
            ranked = sorted(hits, key=lambda h: h.score * self._value(h.experience_id), reverse=True)[:k]
            return ranked, (time.perf_counter() - t0) * 1000

        found, took_ms = await self._on_torch(work)
        self.retrievals += 1
        return RetrieveReply(experiences=found, took_ms=took_ms)

    async def shutdown(self) -> None:
        pool = getattr(self, "pool", None)
        if pool is not None:
            if self._dirty:
                atomic_write_bytes(self.utility_file, json.dumps(self.uses).encode())
            pool.close()
        if getattr(self, "_torch", None) is not None:
            self._torch.shutdown(wait=False)
        await super().shutdown()

    def health(self) -> dict:
        h = super().health()
        pool = getattr(self, "pool", None)
        states: dict[str, int] = {}
        for m in pool.meta.values() if pool else []:
            states[m["state"]] = states.get(m["state"], 0) + 1
        h.update(
            retrievals=getattr(self, "retrievals", 0),
            experiences=states,
            merged=getattr(self, "merged", 0),
            retired=getattr(self, "retired", 0),
            watermark=self.watermark.seq() if pool else 0,
        )
        return h
