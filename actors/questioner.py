"""Questioner: keeps the explorer supplied with tasks at the edge of the policy's ability.

Two sources, mixed by `questioner.synthetic_share`, paced by the explorer's backlog (its durable
consumer's pending + unacked count) so the stream never floods:
- dataset tasks: the environments take turns; each one's train pool goes in a fixed shuffled order
  whose position is persisted, and task event ids derive from (entry, round), so a restart
  republishes nothing new (JetStream drops the duplicate). Held-out entries are never proposed.
  An environment with difficulty levels (the code env) issues only entries of its current rung
  (`policies/tasks/curriculum.py`): the lowest level whose recent groups the policy has not mastered.
- synthetic tasks (`policies/tasks/synthesis.py`, written by `policies/tasks/writer.py`): curiosity-guided
  exploration of a train entry's functions with the served policy (or a configured generator endpoint), a request
  written for the calls that worked, conditioned on recent live requests (they also steer which entries are
  explored, by embedding similarity), semantic dedup in Milvus Lite, and a feasibility replay. One synthesis runs
  at a time, in the background: dataset tasks keep flowing while it explores.
- synthetic tasks on the clients' own tools (`policies/tasks/client_tasks.py`, when `questioner.synth_envs` names
  `client_tools`): the tool sets live requests declared are kept, and a task is a request written about one of
  their functions with the call (or, for `client_parallel_share` of them, two calls) it was written from; the
  synthetic environments take turns.

A synthetic task's lifecycle is data: `evo.task_status` proposed -> verified (or rejected, with
the reason) -> active (issued to the explorer) -> retired. After each judged group of a
synthetic task, its self-consistency p (Agent0: share of the group agreeing with the majority
verdict) decides: inside [band_low, band_high] it stays active and is issued again (up to
`max_issues`), outside it retires as too easy or too hard.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter, deque

from actors.actor import EventActor
from actors.events import Interaction, Judgement, derived_id
from actors.lifecycles import TaskState as T
from actors.task_events import Task
from envs.client_tools import CLIENT_TOOLS
from envs.registry import make_envs
from policies.tasks.book import SyntheticTask, TaskBook, band_decision
from policies.tasks.client_tasks import ClientTaskWriter, ToolSets
from policies.tasks.curriculum import DatasetPools, Ladder, train_pool
from policies.tasks.writer import TaskWriter
from policies.weights.model_store import atomic_write_bytes

SYNTHETIC = "synthetic"  # the ladder of self-written tasks: rung n asks for n + 1 calls


def task_event_id(entry_id: str, round_: int) -> str:
    return derived_id("task", f"{entry_id}:{round_}")


class Questioner(EventActor):
    name = "questioner"
    kinds = ("interaction", "judgement", "weights_promoted", "weights_rolled_back")
    fetch_timeout_s = 2.0

    async def start(self) -> None:
        await super().start()
        s = self.settings
        self.envs = make_envs(s.env)
        self.pool = train_pool(self.envs)
        self.state_file = s.state / "actors" / "questioner.json"
        st = json.loads(self.state_file.read_text()) if self.state_file.exists() else {}
        self._init_pools(st)
        self.book = TaskBook(st.get("synth"))
        self.sigs: set[str] = set(st.get("sigs", []))
        self.visits = Counter(st.get("visits", {}))
        self.mix = st.get("mix", {"env": 0, "synthetic": 0})
        self.live_queries: deque[str] = deque(maxlen=max(1, s.questioner.live_examples))
        self.proposed = 0
        self.rng = random.Random()
        q = s.questioner
        self.synth_envs = [n for n in q.synth_envs if n in self.envs and hasattr(self.envs[n], "probe")]
        self.client_tools = CLIENT_TOOLS in q.synth_envs
        self.toolsets = ToolSets(q.client_tool_sets, q.client_tool_sets_per_user, st.get("toolsets"))
        self.writer: TaskWriter | None = None
        self.client_writer: ClientTaskWriter | None = None
        self.engine = None
        self._synth_job: asyncio.Task | None = None
        self._sync_due = False
        if q.synthetic_share > 0 and (self.synth_envs or self.client_tools):
            await asyncio.to_thread(self._load_models)

    def _init_pools(self, st: dict) -> None:
        """Per-environment train pools, cursors and the ladder (from the persisted state `st`)."""
        self.data = DatasetPools(self.envs, st)
        self.levels = self.data.levels
        self.ladder = Ladder(mastery=self.settings.questioner.band_high, state=st.get("ladder"))

    def _load_models(self) -> None:
        from policies.memory.embedder import Embedder
        from policies.tasks.generators import make_generator
        from policies.tasks.synthesis import TaskIndex

        s = self.settings
        embedder = Embedder(s.embedding.source, s.embedding.dtype)
        (s.state / "questioner").mkdir(parents=True, exist_ok=True)
        index = TaskIndex(str(s.state / "questioner" / "tasks.db"), s.embedding.dim)
        if not s.questioner.generator_base_url:  # the served policy explores: follow the live version
            from policies.engines.live_policy import LivePolicy

            self.policy = LivePolicy(s, "questioner")
            self.engine = self.policy.engine
            self.weights_version = self.policy.sync()
        gen = make_generator(s, self.engine)
        if self.synth_envs:
            self.writer = TaskWriter(self.envs, self.synth_envs, embedder, index, gen, self.visits, self.rng, s.questioner)
        if self.client_tools:
            self.client_writer = ClientTaskWriter(embedder, index, gen, self.visits, self.rng, s.questioner)

    async def handle_weights_promoted(self, ev, msg):
        # the next tick loads the live version, once no exploration runs: never swap weights under one
        self._sync_due = self.engine is not None

    handle_weights_rolled_back = handle_weights_promoted

    def _save(self) -> None:
        atomic_write_bytes(
            self.state_file,
            json.dumps(
                {
                    **self.data.state(),
                    "ladder": self.ladder.state(),
                    "synth": self.book.dump(),
                    "sigs": sorted(self.sigs),
                    "visits": dict(self.visits),
                    "mix": self.mix,
                    "toolsets": self.toolsets.state(),
                }
            ).encode(),
        )

    # ------------------------------------------------------------------ inputs
    async def handle_interaction(self, ev: Interaction, msg):
        users = [m.content for m in ev.messages if m.role == "user" and m.content.strip()]
        if users:
            self.live_queries.append(users[-1][:500])
        if self.client_tools and ev.tools and self.toolsets.add(ev.tools, ev.user_hash, users[-1] if users else ""):
            self._save()  # a new set: a restart keeps it

    async def handle_judgement(self, j: Judgement, msg):
        if j.source == "rollout" and j.origin == "env":
            self._climb(j)
        rec = self.book.get(j.task_id)
        if j.origin != "synthetic" or rec is None or rec.status != T.ACTIVE:
            return
        # synthetic tasks climb too: rung n = references of n + 1 calls (one explicit call first)
        rung = CLIENT_TOOLS if rec.env == CLIENT_TOOLS else SYNTHETIC  # not the explored tasks' ladder
        self.ladder.record(rung, len(rec.reference) - 1, [s.outcome for s in j.samples if not s.off_policy])
        p, reason = band_decision(
            [s.outcome for s in j.samples if not s.off_policy],
            self.settings.questioner.band_low,
            self.settings.questioner.band_high,
        )
        rec.consistency, rec.judged = p, rec.judged + 1
        if reason is None and rec.issued >= self.settings.questioner.max_issues:
            reason = f"issued {rec.issued} times while in band (consistency {p:.2f}); done"
        if reason is None:
            rec.due = True  # in the band: issue it again
        else:
            await self._status(rec, T.RETIRED, reason)
        self._save()

    def _climb(self, j: Judgement) -> None:
        """Record the policy's own success on a dataset task's rung (the judgement names its env and entry)."""
        env = self.envs.get(j.env)
        if env is None or not j.entry_id:
            return
        level = env.level_of(j.entry_id) if hasattr(env, "level_of") else 0
        self.ladder.record(j.env, level, [s.outcome for s in j.samples if not s.off_policy])
        self._save()

    # ------------------------------------------------------------------ outputs
    async def _status(self, rec: SyntheticTask, new: T, reason: str) -> None:
        await self.bus.publish(self.book.move(rec, new, reason), weights_version=self.weights_version)
        self.log.info("task.status", task_id=rec.task_id, status=str(new), reason=reason[:200])

    async def backlog(self) -> int:
        return await self.bus.backlog("explorer")

    def next_entry(self) -> tuple[str, int]:
        return self.data.next_entry(self.ladder, self.settings.questioner.env_weights)

    def _want_synthetic(self) -> bool:
        share = self.settings.questioner.synthetic_share
        if share <= 0 or (self.writer is None and self.client_writer is None):
            return False
        total = self.mix["env"] + self.mix["synthetic"]
        return self.mix["synthetic"] < share * (total + 1)

    def synthesizing(self) -> bool:
        return self._synth_job is not None and not self._synth_job.done()

    async def tick(self) -> None:
        if self._sync_due and not self.synthesizing():  # a promotion or rollback arrived: follow it
            self._sync_due = False
            self.weights_version = await asyncio.to_thread(self.policy.sync)
        if not (self.pool or self.client_writer) or await self.backlog() >= self.settings.rollout.max_tasks_in_flight:
            return
        if self._want_synthetic():
            task_id = self.book.next_due()
            if task_id is not None:
                await self.issue_synthetic(task_id)
                return
            idle = self.writer is None and not self.toolsets.sets  # no live request has declared tools yet
            if not self.synthesizing() and not idle:  # in the background: dataset tasks keep flowing meanwhile
                self._synth_job = asyncio.create_task(self.synthesize())
        if self.pool and self.settings.questioner.synthetic_share < 1:  # 1: self-written tasks only
            await self.issue_env()

    async def issue_env(self) -> None:
        key, round_ = self.next_entry()
        env_name, entry = key.split("\t")
        env = self.envs[env_name]
        event = Task(
            event_id=task_event_id(key, round_),
            task_id=f"{env_name}:{entry}:{round_}",
            env=env_name,
            entry_id=entry,
            split="train",
            origin="env",
            query=env.query_of(entry),
        )
        await self.bus.publish(event, weights_version=self.weights_version)
        self.mix["env"] += 1
        self._save()
        self.proposed += 1
        self.log.info("task.proposed", task_id=event.task_id, event_id=event.event_id)

    async def issue_synthetic(self, task_id: str) -> None:
        rec = self.book.get(task_id)
        rec.issued, rec.due = rec.issued + 1, False
        if rec.status == T.VERIFIED:
            await self._status(rec, T.ACTIVE, "issued to the explorer")
        event = Task(
            event_id=task_event_id(task_id, rec.issued),
            task_id=task_id,
            env=rec.env,
            entry_id=rec.entry,
            split="train",
            origin="synthetic",
            query=rec.query,
            reference=rec.reference,
            base_entry_id=rec.base,
            tools=rec.tools,
        )
        await self.bus.publish(event, weights_version=self.weights_version)
        self.mix["synthetic"] += 1
        self._save()
        self.proposed += 1
        self.log.info("task.issued", task_id=task_id, issue=rec.issued)

    # ------------------------------------------------------------------ synthesis
    def _calls(self) -> int:
        """How many calls a synthetic task's reference may have: one explicit call first, then the ladder's rung."""
        return 1 + self.ladder.rung(SYNTHETIC, list(range(self.settings.questioner.max_reference_calls)))

    async def synthesize(self) -> str | None:
        try:  # a failed synthesis (or a status that could not be published) never stops the dataset tasks
            log = self.settings.state / "questioner" / "explorations.jsonl"
            live = list(self.live_queries)
            turn = self.writer is None or self.rng.random() < 1 / (1 + len(self.synth_envs))
            if self.client_writer and self.toolsets.sets and turn:
                sets = self.toolsets.snapshot()  # the environments take turns; a copy for the writer's thread
                rec = await asyncio.to_thread(self.client_writer.write, live, self.sigs, sets)
            else:
                rec = await asyncio.to_thread(self.writer.write, live, self._calls, self.sigs, log, self.weights_version)
            if rec is None or rec["outcome"] == "empty":
                self.log.info("synthesis.nothing_new", base=rec and rec.get("base"))
                return None
            task: SyntheticTask = rec["task"]
            how = "about the declared tools" if task.env == CLIENT_TOOLS else "from exploring"
            await self._status(task, T.PROPOSED, f"written by {task.synthesizer} {how} {task.base}")
            self.sigs.add(task.sig)
            verified = rec["outcome"] == "verified"
            await self._status(task, T.VERIFIED if verified else T.REJECTED, rec["reason"])
            self._save()
            return task.task_id if verified else None
        except Exception as exc:
            self.failures, self.last_error = self.failures + 1, repr(exc)[:500]
            self.log.warning("synthesis.failed", error=repr(exc)[:300])
            return None

    def health(self) -> dict:
        counts = self.book.counts() if hasattr(self, "book") else {}
        ladder = (
            self.ladder.summary({**self.levels, SYNTHETIC: list(range(self.settings.questioner.max_reference_calls))})
            if hasattr(self, "ladder")
            else {}
        )
        return {
            **super().health(),
            "proposed": self.proposed,
            "cursors": self.data.cursors if hasattr(self, "data") else None,
            "ladder": ladder,
            "synthetic": dict(counts),
            "mix": getattr(self, "mix", None),
            "synthesizing": hasattr(self, "_synth_job") and self.synthesizing(),
        }
