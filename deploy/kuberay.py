"""The two Serve applications a KubeRay RayService runs (deploy/k8s/rayservice.yaml): the API and the evolution.

A RayService has no entrypoint: KubeRay starts the Ray cluster and submits the Serve config, nothing else.
Whatever must run has to be part of a Serve application, so the six evolution actors are started by one
here: `Evolution`, a one-replica deployment with no HTTP route. Its replica does what `up` does for them
(`launch.ensure_stream`, then `ray_local.start_actors`), with the actors detached and started only where
none of that name runs (`get_if_exists`): they outlive the replica, a restarted replica finds them instead
of starting a second set, and its health check (every 30 s) starts again any that were lost for good and
probes each one (a `pid()` call, read at the next check, so an actor loading its model is not a failure).
The replica reports unhealthy while they cannot be started (NATS unreachable, wrong password, an actor
whose constructor raises); Serve then replaces it, so a start that failed is retried without anyone's help. A
RayService cannot run a job beside Serve, and an init container or a sidecar would start them outside the
cluster's own restart and health machinery; a deployment keeps them inside it, in the same RayService.

Both applications read the same args (a preset, the state dir, the NATS URL, the files the Secret is
mounted at), parsed once here, so the API and the actors always describe the same system.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from ray import serve

from config import telemetry
from config.settings import Settings, load_settings
from deploy import launch, ray_local

NATS_ATTEMPTS = 20  # a bounded connect (about a minute): a replica that cannot reach NATS reports it, then retries


def settings_from_args(args: dict) -> Settings:
    """Serve args -> Settings: {config, state_dir, nats_url, nats_password_file, api_key_file, own_url}.
    The key and the password are read from files (a mounted Secret), never from the args themselves."""
    overrides = {k: args[a] for a, k in (("state_dir", "state_dir"), ("nats_url", "nats.url")) if args.get(a)}
    s = load_settings(args.get("config"), **overrides)
    if args.get("nats_password_file"):
        s.nats.password = Path(args["nats_password_file"]).read_text().strip()
    if args.get("api_key_file"):
        s.serve.api_key = Path(args["api_key_file"]).read_text().strip()
    if not s.serve.api_key:
        raise ValueError("the Serve args need api_key_file (or serve.api_key in the preset)")
    if args.get("own_url"):  # where "self" (judge, task writer) reaches our own API inside the cluster
        launch.use_own_endpoint(s, args["own_url"])
    return s


@serve.deployment(
    num_replicas=1,
    ray_actor_options={"num_cpus": 0},
    health_check_period_s=30,
    health_check_timeout_s=120,
    graceful_shutdown_timeout_s=5,
)
class Evolution:
    """Keeps the six named, detached evolution actors running; unhealthy while they cannot be started."""

    async def __init__(self, settings_json: str):
        self.s = Settings.model_validate_json(settings_json)
        self.stream_ready = False
        self.probes: dict = {}  # actor name -> concurrent Future of its last pid() call
        self.error: str | None = None
        self.log = telemetry.log(actor="evolution")
        # A failure is not raised here but by the first health check: Serve retries a failing constructor a few
        # times only, and replaces an unhealthy replica for as long as it takes (NATS may still be starting).
        await self._ensure()

    async def _ensure(self) -> None:
        try:
            if not self.stream_ready:  # once: afterwards a NATS outage is the actors' to ride out, not ours
                await launch.ensure_stream(self.s, attempts=NATS_ATTEMPTS)
                self.stream_ready = True
            await asyncio.to_thread(self._start_and_probe)
            self.error = None
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"[:500]
            self.log.warning("actors.not_started", error=self.error)

    def _start_and_probe(self) -> None:
        """Start the actors that do not run, then read each one's last probe (a `pid()` call): a failed one means
        the actor died or its constructor raised (Ray does not restart a constructor that raises); a pending
        one, an actor still starting (loading its model), which is not a failure."""
        handles = ray_local.start_actors(self.s, True)
        failed = [f"{name}: {fut.exception()}" for name, fut in self.probes.items() if fut.done() and fut.exception()]
        self.probes = {name: fut for name, fut in self.probes.items() if not fut.done()}
        for name, handle in handles.items():
            if name not in self.probes:
                self.probes[name] = handle.pid.remote().future()
        if failed:
            raise RuntimeError("; ".join(failed))

    async def check_health(self) -> None:
        await self._ensure()
        if self.error:
            raise RuntimeError(f"the evolution actors cannot be started: {self.error}")

    async def __call__(self) -> dict:
        """What runs (for a DeploymentHandle; the application has no HTTP route)."""
        return {"actors": [f"kaizen-{n}" for n in ray_local.ACTORS], "namespace": ray_local.NAMESPACE, "error": self.error}


def evolution_app(args: dict):
    """`import_path: deploy.kuberay:evolution_app`: the deployment that starts and keeps the six actors."""
    return Evolution.bind(settings_from_args(args).model_dump_json())


def api_app(args: dict):
    """`import_path: deploy.kuberay:api_app`: the OpenAI-compatible API (`serve/app.py`) on the same settings."""
    from serve.app import build_app

    s = settings_from_args(args)
    return build_app(s, s.serve.api_key)
