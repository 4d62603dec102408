"""Questioner: keeps the explorer supplied with tasks at the edge of the policy's ability.

First form: tasks come from the environment's own train pool, in a fixed shuffled order, paced
by the explorer's backlog (its durable consumer's pending + unacked count), so the stream never
floods. The position in the pool is persisted; task event ids are derived from (entry, round)
so a restart republishes nothing new (JetStream drops the duplicate). Held-out entries are
never proposed.
"""
from __future__ import annotations

import json
import random
import uuid

from actors.bus import EventActor
from actors.events import Task
from envs.registry import make_envs
from policies.model_store import atomic_write_bytes


def task_event_id(entry_id: str, round_: int) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"kaizen:task:{entry_id}:{round_}"))


def ordered_pool(entries: list[str], round_: int, seed: int = 0) -> list[str]:
    pool = sorted(entries)
    random.Random(f"{seed}:{round_}").shuffle(pool)
    return pool


def train_pool(envs: dict) -> list[str]:
    """"env<TAB>entry" for every train entry of every environment (held-out entries never appear)."""
    return [f"{name}\t{e}" for name, env in envs.items() for e in env.entries("train")]


class Questioner(EventActor):
    name = "questioner"
    kinds = ()
    fetch_timeout_s = 2.0

    async def start(self) -> None:
        await super().start()
        self.envs = make_envs(self.settings.env)
        self.pool = train_pool(self.envs)
        self.cursor_file = self.settings.state / "actors" / "questioner.json"
        self.cursor = json.loads(self.cursor_file.read_text()) if self.cursor_file.exists() else {"round": 0, "pos": 0}
        self.proposed = 0

    async def backlog(self) -> int:
        try:
            info = await self.bus.consumer_info("explorer")
        except Exception:  # the explorer has not bound yet: treat as empty
            return 0
        return int(info.num_pending) + int(info.num_ack_pending)

    def next_entry(self) -> tuple[str, int]:
        r, p = self.cursor["round"], self.cursor["pos"]
        if p >= len(self.pool):
            r, p = r + 1, 0
        entry = ordered_pool(self.pool, r)[p]
        self.cursor = {"round": r, "pos": p + 1}
        return entry, r

    async def tick(self) -> None:
        if not self.pool or await self.backlog() >= self.settings.rollout.max_tasks_in_flight:
            return
        key, round_ = self.next_entry()
        env_name, entry = key.split("\t")
        env = self.envs[env_name]
        event = Task(event_id=task_event_id(key, round_), task_id=f"{env_name}:{entry}:{round_}",
                     env=env_name, entry_id=entry, split="train", origin="env", query=env.query_of(entry))
        await self.bus.publish(event, weights_version=self.weights_version)
        atomic_write_bytes(self.cursor_file, json.dumps(self.cursor).encode())
        self.proposed += 1
        self.log.info("task.proposed", task_id=event.task_id, event_id=event.event_id)

    def health(self) -> dict:
        return {**super().health(), "proposed": self.proposed, "cursor": getattr(self, "cursor", None)}
