"""Local Ray and the long-lived actor processes.

`ActorHost` is the Ray actor that hosts one evolution actor: it builds it in `__init__` and runs
its asyncio loop in a thread, so after a crash Ray restarts the process (`max_restarts=-1`),
`__init__` runs again and the actor resumes from its durable consumer. Ray listens on loopback
only, with the dashboard off; on `ray.node_ip` instead when other hosts join this one (`deploy/join.py`).
"""

from __future__ import annotations

import asyncio
import importlib
import os
import threading
import time

ACTORS = {
    "questioner": "actors.questioner:Questioner",
    "explorer": "actors.explorer:Explorer",
    "attributor": "actors.attributor:Attributor",
    "navigator": "actors.navigator:Navigator",
    "learner": "actors.learner:Learner",
    "broadcaster": "actors.broadcaster:Broadcaster",
}
NAMESPACE = "kaizen"


def ray_env() -> dict[str, str]:
    # RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 keeps every Ray address on loopback (127.0.0.1).
    # RAY_worker_niceness=0: Ray starts every worker process at nice 15 by default, serving replicas included,
    # which would leave `ray.actor_nice` (added on top, capped at 19) no room to put users first.
    return {
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "RAY_worker_niceness": "0",
    }


def ray_auth_env(state) -> dict[str, str]:
    """Token auth on, with the token kept in the state dir (0600) instead of ~/.ray: the variables that say so."""
    import secrets
    from pathlib import Path

    from config.private import secret_file

    path = Path(state) / "ray_auth_token"
    secret_file(path, lambda: secrets.token_hex(32))
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(path)}


def process_env(state) -> dict[str, str]:
    """What a process that starts or joins our Ray needs in its environment before the first `import ray`
    (Ray's constants read it at import): main.py sets it, the only place that writes the environment."""
    return {**ray_env(), **ray_auth_env(state)}


def init_ray(settings) -> None:
    if os.environ.get("RAY_AUTH_MODE") != "token":
        raise RuntimeError(
            "the process environment for Ray is not set: os.environ.update(ray_local.process_env("
            "state)) before the first `import ray` (main.py does)"
        )
    import ray

    if settings.ray.address:
        ray.init(address=settings.ray.address, namespace=NAMESPACE, log_to_driver=False)
        return
    temp = settings.state / "ray"
    extra = {"_temp_dir": str(temp)} if len(str(temp)) <= 40 else {}  # unix socket paths are short
    if settings.ray.node_ip:  # the head of several hosts: they join it at this address
        extra["_node_ip_address"] = settings.ray.node_ip
    ray.init(
        num_cpus=settings.ray.num_cpus,
        include_dashboard=False,
        dashboard_host="127.0.0.1",
        namespace=NAMESPACE,
        log_to_driver=False,
        runtime_env={"env_vars": ray_env()},
        **extra,
    )


class ActorHost:
    def __init__(self, target: str, settings_json: str):
        from config import telemetry
        from config.settings import Settings
        from deploy.procs import renice_process

        self.settings = Settings.model_validate_json(settings_json)
        name = target.split(":")[1].lower()
        logs = self.settings.state / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        telemetry.setup(
            name,
            self.settings.telemetry.log_level,
            self.settings.telemetry.otlp_endpoint,
            stream=open(logs / f"{name}.log", "a", buffering=1),
        )
        nice = self.settings.ray.actor_nice.get(name, 0)
        if nice > 0:  # this process is the actor's own (an actor run in a test's process keeps its priority)
            renice_process(nice)
        mod, cls = target.split(":")
        self.actor = getattr(importlib.import_module(mod), cls)(self.settings)
        self.started = time.time()
        self.error: str | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread = threading.Thread(target=self._run, name=target, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # the loop itself died: let Ray restart the whole process
            self.error = repr(exc)
            time.sleep(2.0)
            os._exit(1)

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        await self.actor.run()

    def health(self) -> dict:
        return {
            **self.actor.health(),
            "pid": os.getpid(),
            "alive": self.thread.is_alive(),
            "uptime_s": round(time.time() - self.started, 1),
            "error": self.error,
        }

    def pid(self) -> int:
        return os.getpid()

    def stop(self, timeout_s: float = 30.0) -> bool:
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.actor.stop.set)
        self.thread.join(timeout_s)
        return not self.thread.is_alive()


def start_actors(settings, detached: bool = False) -> dict:
    """Start the six actors as named Ray actors. `up` owns them (they end with its driver); `detached` (KubeRay,
    `deploy/kuberay.py`) makes them outlive the process that starts them, and starts only those not running,
    so calling it again is how a lost one comes back."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    remote = ray.remote(ActorHost)
    handles = {}
    # `up`'s actors keep their state in this host's state dir (checkpoints, memory, the pointer's copy): when other
    # hosts joined (`main.py join`), a restart must not take one to a node whose state dir is another
    here = (
        {}
        if detached
        else {"scheduling_strategy": NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)}
    )
    # the navigator answers the live agent's retrieval queries with `memory.search_threads` torch threads;
    # OpenMP reads its thread count when the process starts (everything else runs one thread per worker)
    threads = {"navigator": settings.memory.search_threads}
    for name, target in ACTORS.items():
        env = {**ray_env(), "OMP_NUM_THREADS": str(threads.get(name, 1))}
        handles[name] = remote.options(
            name=f"kaizen-{name}",
            namespace=NAMESPACE,
            num_cpus=settings.ray.actor_cpus,
            num_gpus=settings.ray.actor_gpus.get(name, 0.0),
            max_restarts=-1,
            max_task_retries=-1,
            lifetime="detached" if detached else None,
            get_if_exists=detached,
            max_concurrency=4,
            runtime_env={"env_vars": env},
            **here,
        ).remote(target, settings.model_dump_json())
    return handles


def stop_actors(handles: dict, timeout_s: float = 40.0) -> list[str]:
    """Ask every actor to drain at once; kill the ones that do not finish in time. Returns their names."""
    import ray

    refs = {name: h.stop.remote(timeout_s / 2) for name, h in handles.items()}
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
    late = [name for name, ref in refs.items() if ref not in ready]
    for name in late:
        ray.kill(handles[name], no_restart=True)
    return late


def get_actor(name: str):
    import ray

    return ray.get_actor(f"kaizen-{name}", namespace=NAMESPACE)
