"""Explorer: turns each task into a group of multi-turn rollouts with the newest weights.

For every `evo.task` it runs `rollout.group_size` episodes against the real environment in
lockstep (batched generation). The first `guided_share` of the group gets experiences retrieved
from the navigator (NATS request/reply); the training view strips them. Emits one `evo.rollout`
per group (groups stay intact). When no sample of a group solves its task (`rollout.reference_on_failure`),
the environment's reference trajectory, replayed and verified in a fresh episode, joins the group as an
off-policy sample (mixed-policy GRPO: the learner trains it with LUFFY's shaped objective), so a
policy at the floor of a task still gets a direction to move in.
A task on the clients' own tools (env `client_tools`, the questioner's, `policies/tasks/client_tasks.py`) carries
its tool set and reference calls; it is rolled out in `envs/client_tools.py`, in process, whatever `env.names` says.
An `evo.live_step` (the attributor's, `policies/judge/live_steps.py`) is one live step, taken ahead of tasks (its own
consumer, `first_kinds`): the explorer re-samples `conversations.alternatives` answers from its context as Serve would
answer that request, and the served answer and its alternatives, scored by `envs/live.py` against the tools the
request declared, go out as one group.
With `rollout.weights: published` (default) it samples with the learner's newest published version
(`evo.weights_published`), so its groups stay within the learner's staleness bound however long the
gate takes; a rejected or rolled-back version sends it back to live, as it does the learner. With `live` it follows
`evo.weights_promoted` / `_rolled_back` only.
"""

from __future__ import annotations

import asyncio
import math
import time

from actors.actor import EventActor, heartbeat
from actors.bus import Poison
from actors.events import (
    RetrieveReply,
    RetrieveRequest,
    WeightsPromoted,
    WeightsPublished,
    WeightsRejected,
    WeightsRolledBack,
    derived_id,
)
from actors.task_events import LiveStep, Rollout, Task
from envs.client_tools import CLIENT_TOOLS, ClientToolsEnvironment
from envs.live import alternatives, confirmed_alternatives, consensus_alternatives
from envs.registry import make_envs
from envs.tool_calls import CallError, parse_python_call
from policies.alternatives import resample_step
from policies.engines.live_policy import LivePolicy
from policies.rollout import reference_sample, run_group
from policies.tasks.client_tasks import verify as verify_client_task


class Explorer(EventActor):
    name = "explorer"
    kinds = ("task",)
    # users' steps go ahead of environment tasks, and so do the weights to sample them with
    first_kinds = ("live_step", "weights_published", "weights_promoted", "weights_rejected", "weights_rolled_back")
    batch = 1

    def __init__(self, settings, bus=None):
        super().__init__(settings, bus)
        self._train_sets: dict[str, set[str]] = {}

    async def start(self) -> None:
        await super().start()
        s = self.settings
        self.envs = make_envs(s.env)
        if s.env.pool_workers > 0:  # episodes run in the environment pool's Ray actors
            from envs.pool import PooledEnvironment, start_workers

            workers = await asyncio.to_thread(start_workers, s, s.env.pool_workers)
            self.envs = {n: PooledEnvironment(e, workers, s.env.max_concurrent) for n, e in self.envs.items()}
        self.envs[CLIENT_TOOLS] = ClientToolsEnvironment()  # tasks on the tools live requests declared (in process)
        self.policy = await asyncio.to_thread(LivePolicy, s, "explorer", log=self.log)
        await self.policy.attach(self.bus.js)  # the pointer's copy kept; versions fetched from the bus (nats)
        self.engine = self.policy.engine
        await self._follow()
        self.groups = 0

    async def _follow(self) -> None:
        """Before a group: load the version to sample with, if it changed since the last group."""
        self.weights_version = await asyncio.to_thread(self.policy.follow)

    def _train(self, env_name: str) -> set[str]:
        if env_name not in self._train_sets:
            self._train_sets[env_name] = set(self.envs[env_name].entries("train"))
        return self._train_sets[env_name]

    async def retrieve(self, query: str) -> RetrieveReply:
        try:
            return await self.bus.request("retrieve", RetrieveRequest(query=query, k=3), RetrieveReply, timeout=2.0)
        except Exception as exc:  # memory is an aid, never a dependency
            self.log.warning("retrieve.failed", error=repr(exc)[:200])
            return RetrieveReply()

    async def handle_task(self, task: Task, msg):
        if task.split != "train":
            raise Poison(f"task {task.task_id} is from the {task.split} split; only train tasks are explored")
        env = self.envs.get(task.env)
        if env is None:
            raise Poison(f"task {task.task_id} names unknown environment {task.env!r}")
        spec = None
        if task.env == CLIENT_TOOLS:
            if task.origin != "synthetic" or not task.tools or not task.reference:
                raise Poison(f"task {task.task_id} on the clients' tools lacks its tools or its reference calls")
            ok, why = verify_client_task(task.reference, task.tools)
            if not ok:
                raise Poison(f"task {task.task_id} has an unusable reference: {why}")
            spec = {"query": task.query, "reference": task.reference, "tools": [t.model_dump() for t in task.tools]}
        elif task.origin == "synthetic":
            if not task.base_entry_id or not task.reference:
                raise Poison(f"synthetic task {task.task_id} lacks a base entry or a reference solution")
            if task.base_entry_id not in self._train(task.env):
                raise Poison(
                    f"synthetic task {task.task_id} starts from {task.base_entry_id}, which is not in the "
                    f"{task.env} train split (held-out entries are never explored)"
                )
            try:
                for call in task.reference:
                    parse_python_call(call)
            except CallError as exc:
                raise Poison(f"synthetic task {task.task_id} has an unusable reference: {exc}") from None
            spec = {"base_entry_id": task.base_entry_id, "query": task.query, "reference": task.reference}
        elif task.entry_id not in self._train(task.env):
            raise Poison(f"entry {task.entry_id} is not in the {task.env} train split (held-out entries are never explored)")
        r = self.settings.rollout
        mem = await self.retrieve(task.query)
        exps = [e.text for e in mem.experiences]
        guided = math.ceil(r.group_size * r.guided_share) if exps else 0
        async with heartbeat([msg]):
            await self._follow()
            version = self.engine.version
            res = await asyncio.to_thread(
                run_group,
                self.engine,
                env,
                task.entry_id,
                r.group_size,
                max_new_tokens=r.max_new_tokens,
                temperature=r.temperature,
                top_p=r.top_p,
                experiences=exps,
                guided=guided,
                experience_ids=[e.experience_id for e in mem.experiences],
                call_prefix=r.call_prefix,
                spec=spec,
                choose_names=r.choose_name,
            )
            samples = list(res.samples)
            if r.reference_on_failure and max(s.outcome for s in samples) < 1.0:  # learning from the floor
                ref = await asyncio.to_thread(reference_sample, env, task.entry_id, spec)
                if ref is not None:
                    samples.append(ref)
        event = Rollout(
            event_id=derived_id("rollout", task.event_id),
            task=task,
            group_id=task.event_id,
            samples=samples,
            duration_s=res.duration_s,
            trace_id=task.trace_id,
        )
        await self.bus.publish(event, weights_version=version)
        self.groups += 1
        self.log.info(
            "rollout.done",
            task_id=task.task_id,
            outcomes=[round(s.outcome, 2) for s in res.samples],
            reference=len(samples) > len(res.samples),
            guided=guided,
            seconds=round(res.duration_s, 1),
            tokens=res.tokens,
        )

    async def handle_live_step(self, task: LiveStep, msg) -> None:
        """A live step's group: the answer users were served, then its re-sampled alternatives (module docstring)."""
        step = task.step
        if task.split != "train" or step is None or step.step_indices != [len(step.messages) - 1]:
            raise Poison(f"live task {task.task_id} carries no one-step sample to re-sample")
        n, r = self.settings.conversations.alternatives, self.settings.rollout
        async with heartbeat([msg]):
            await self._follow()
            version, t0 = self.engine.version, time.monotonic()
            try:
                answers, tokens = await asyncio.to_thread(
                    resample_step,
                    self.engine,
                    step,
                    task.tool_choice,
                    n,
                    max_new_tokens=self.settings.conversations.alternative_tokens,
                    temperature=r.temperature,
                    top_p=r.top_p,
                    guided=self.settings.conversations.guided_alternatives,
                    response_format=task.response_format,
                )
            except ValueError as exc:  # a tool_choice that names no declared function: the step alone (a turned-down
                # one, with `consensus`, not at all: no answers, no majority)
                self.log.warning("live_step.not_resampled", task_id=task.task_id, error=str(exc)[:200])
                answers, tokens = [], 0
        teach, checked, by = self.settings.conversations.teach, None, "tool-fit"
        if teach != "all" and step.outcome > 0:  # the next turn took it well: the served call is the reference
            checked, by = confirmed_alternatives(step, answers), "served-call"
        elif teach == "consensus":  # turned down: the call most answers give is, if there is one
            if (checked := consensus_alternatives(step, answers)) is None:
                self.no_consensus = getattr(self, "no_consensus", 0) + 1
                self.log.info("live_step.no_consensus", task_id=task.task_id, answers=len(answers))
                return
            by = "consensus"
        samples = checked or alternatives(step, answers, task.tool_choice)
        event = Rollout(
            event_id=derived_id("rollout", task.event_id),
            task=task.model_copy(update={"step": None}),  # the step travels once: as the first sample
            group_id=task.event_id,
            samples=samples,
            duration_s=time.monotonic() - t0,
            trace_id=task.trace_id,
            behaviour_versions=[task.weights_version] + [version] * len(answers),
            scored_by=by if checked else "tool-fit",
        )
        await self.bus.publish(event, weights_version=version)
        self.groups += 1
        self.log.info(
            "rollout.live_step",
            task_id=task.task_id,
            outcomes=[round(s.outcome, 2) for s in samples],
            seconds=round(event.duration_s, 1),
            tokens=tokens,
        )

    async def handle_weights_published(self, ev: WeightsPublished, msg):
        if self.settings.rollout.weights == "published" and not ev.force:
            self.policy.aim(ev.weights)

    async def handle_weights_promoted(self, ev: WeightsPromoted, msg):
        if self.policy.target is None:
            await self._follow()

    async def handle_weights_rejected(self, ev: WeightsRejected, msg):
        self.policy.drop_branch(ev.weights.version)

    async def handle_weights_rolled_back(self, ev: WeightsRolledBack, msg):
        self.policy.drop_branch(ev.from_version)
        if self.policy.target is None:
            await self._follow()

    def health(self) -> dict:
        return {
            **super().health(),
            "groups": getattr(self, "groups", 0),
            "live_steps_without_consensus": getattr(self, "no_consensus", 0),  # `conversations.teach: consensus`
            "sampling_with": getattr(getattr(self, "engine", None), "version", None),
        }
