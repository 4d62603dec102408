"""Environments served by a pool of Ray actors (AgentEvolver's env-service contract).

`EnvWorker` (a Ray actor) holds live episodes by instance id and offers create / step /
evaluate / get_info / release; a background thread releases instances idle for longer than
`idle_s`. `PooledEnvironment` looks like a local `Environment` to the rollout code, but each
`episode()` is created on a worker (round robin) and counts against a concurrency limit until it
is released. The pool renews a lease on the episodes it holds (`touch`, every `keepalive_s`), so a
slow generation between two steps never loses them; only an owner that died stops renewing. Tool execution, and its
failures, stay out of the explorer's process.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid

from actors.events import ChatMessage, ToolSpec
from envs.base import StepResult


class EnvWorker:
    def __init__(self, env_settings_json: str, idle_s: float = 300.0):
        from config.settings import EnvSettings
        from envs.registry import make_envs

        self.envs = make_envs(EnvSettings.model_validate_json(env_settings_json))
        self.episodes: dict[str, object] = {}
        self.touched: dict[str, float] = {}
        self.idle_s, self.created, self.reaped = idle_s, 0, 0
        self._lock = threading.Lock()
        threading.Thread(target=self._reaper, daemon=True).start()

    def _reaper(self) -> None:
        while True:
            time.sleep(min(30.0, self.idle_s / 2))
            self.gc()

    def gc(self) -> int:
        now = time.monotonic()
        with self._lock:
            stale = [i for i, t in self.touched.items() if now - t > self.idle_s]
            for i in stale:
                self.episodes.pop(i, None)
                self.touched.pop(i, None)
            self.reaped += len(stale)
        return len(stale)

    def _get(self, iid: str):
        with self._lock:
            ep = self.episodes.get(iid)
            if ep is None:
                raise KeyError(f"unknown or released environment instance {iid}")
            self.touched[iid] = time.monotonic()
            return ep

    def touch(self, iids: list[str]) -> int:
        """Renew the lease of these instances (their owner is alive); returns how many are still held."""
        now = time.monotonic()
        with self._lock:
            held = [i for i in iids if i in self.episodes]
            for i in held:
                self.touched[i] = now
        return len(held)

    def create(self, env: str, entry_id: str, spec: dict | None = None) -> dict:
        ep = self.envs[env].episode(entry_id, spec)
        iid = uuid.uuid4().hex
        with self._lock:
            self.episodes[iid], self.touched[iid] = ep, time.monotonic()
            self.created += 1
        return {"instance_id": iid, **self.get_info(iid)}

    def get_info(self, iid: str) -> dict:
        ep = self._get(iid)
        return {"entry_id": ep.entry_id, "system_prompt": ep.system_prompt, "tools": [t.model_dump() for t in ep.tools]}

    def next_user_message(self, iid: str) -> str | None:
        return self._get(iid).next_user_message()

    def step(self, iid: str, action_json: str) -> dict:
        r = self._get(iid).step(ChatMessage.model_validate_json(action_json))
        return {
            "observations": [o.model_dump() for o in r.observations],
            "signal": r.signal,
            "turn_done": r.turn_done,
            "errors": r.errors,
        }

    def evaluate(self, iid: str) -> float:
        return self._get(iid).outcome()

    def release(self, iid: str) -> None:
        with self._lock:
            self.episodes.pop(iid, None)
            self.touched.pop(iid, None)

    def stats(self) -> dict:
        with self._lock:
            return {"live": len(self.episodes), "created": self.created, "reaped": self.reaped}


class RemoteEpisode:
    """The `Episode` protocol over an `EnvWorker` handle (handles are Ray actors or local objects)."""

    def __init__(self, worker, call, env: str, entry_id: str, on_release, spec: dict | None = None):
        self.w, self._call, self._on_release = worker, call, on_release
        info = call(worker.create, env, entry_id, spec)
        self.iid, self.entry_id, self.system_prompt = info["instance_id"], info["entry_id"], info["system_prompt"]
        self._tools = info["tools"]
        self.released = False

    @property
    def tools(self) -> list[ToolSpec]:
        return [ToolSpec.model_validate(t) for t in self._tools]

    def next_user_message(self) -> str | None:
        msg = self._call(self.w.next_user_message, self.iid)
        self._tools = self._call(self.w.get_info, self.iid)["tools"]  # tools may change per turn (miss_func)
        return msg

    def step(self, action: ChatMessage) -> StepResult:
        r = self._call(self.w.step, self.iid, action.model_dump_json())
        return StepResult([ChatMessage.model_validate(o) for o in r["observations"]], r["signal"], r["turn_done"], r["errors"])

    def end_turn(self) -> None:
        pass

    def outcome(self) -> float:
        return self._call(self.w.evaluate, self.iid)

    def release(self) -> None:
        if not self.released:
            self.released = True
            try:
                self._call(self.w.release, self.iid)
            finally:
                self._on_release()


def _ray_call(method, *args):
    import ray

    return ray.get(method.remote(*args), timeout=120)


def _local_call(method, *args):
    return method(*args)


class PooledEnvironment:
    """A local environment's catalogue (entries, queries, categories) with episodes on the pool."""

    def __init__(
        self,
        local_env,
        workers: list,
        max_concurrent: int,
        remote: bool = True,
        slot_timeout_s: float = 600,
        keepalive_s: float = 30.0,
    ):
        self.local, self.name = local_env, local_env.name
        self.workers = itertools.cycle(workers)
        self.slots = threading.BoundedSemaphore(max_concurrent)
        self.call = _ray_call if remote else _local_call
        self.slot_timeout_s = slot_timeout_s
        self.held: dict[str, RemoteEpisode] = {}  # instance id -> episode, until released
        self._held_lock = threading.Lock()
        if keepalive_s > 0:  # 0: no lease renewal (tests of a dead owner)
            threading.Thread(target=self._keepalive, args=(keepalive_s,), daemon=True).start()

    def _keepalive(self, every_s: float) -> None:
        while True:
            time.sleep(every_s)
            self.renew()

    def renew(self) -> int:
        """Touch every held episode on its worker (one call per worker); returns how many are still held."""
        with self._held_lock:
            eps = list(self.held.values())
        by_worker: dict[int, tuple] = {}
        for ep in eps:
            by_worker.setdefault(id(ep.w), (ep.w, []))[1].append(ep.iid)
        n = 0
        for worker, iids in by_worker.values():
            try:
                n += self.call(worker.touch, iids)
            except Exception:  # a restarting worker lost them anyway; the episode's next call says so
                pass
        return n

    def entries(self, split):
        return self.local.entries(split)

    def query_of(self, entry_id):
        return self.local.query_of(entry_id)

    def category_of(self, entry_id):
        return self.local.category_of(entry_id)

    def reference_solution(self, entry_id, spec=None):
        solve = getattr(self.local, "reference_solution", None)
        return solve(entry_id, spec) if solve else None

    def level_of(self, entry_id):
        level = getattr(self.local, "level_of", None)
        return level(entry_id) if level else 0

    def episode(self, entry_id: str, spec: dict | None = None) -> RemoteEpisode:
        if not self.slots.acquire(timeout=self.slot_timeout_s):
            raise TimeoutError(f"no environment slot free within {self.slot_timeout_s} s")
        box: list[RemoteEpisode] = []

        def released():
            if box:
                with self._held_lock:
                    self.held.pop(box[0].iid, None)
            self.slots.release()

        try:
            ep = RemoteEpisode(next(self.workers), self.call, self.name, entry_id, released, spec)
        except BaseException:
            self.slots.release()
            raise
        box.append(ep)
        with self._held_lock:
            self.held[ep.iid] = ep
        return ep


def start_workers(settings, n: int) -> list:
    """Named EnvWorker actors (restarted by Ray after a crash; episodes then fail and are retried)."""
    import ray

    remote = ray.remote(EnvWorker)
    return [
        remote.options(
            name=f"kaizen-env-{i}", namespace="kaizen", num_cpus=0.25, max_restarts=-1, max_concurrency=16, get_if_exists=True
        ).remote(settings.env.model_dump_json(), settings.env.idle_release_s)
        for i in range(n)
    ]
