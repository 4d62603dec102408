"""`up` and `down`: the process that runs everything, its run file, and stopping it.

`up` starts, in order: the embedded nats-server (unless `nats.url` is configured; supervised and
restarted on the same port and store), the `EVO` stream, the base model (converted once), local Ray
(unless `ray.address`), the six actors and the Ray Serve app; it writes the run file (0600) that the
other commands read, and stops cleanly on SIGINT/SIGTERM. `down` sends SIGTERM and kills what is left
after its timeout. The process environment for Ray is set by main.py before `up` runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

from config.settings import Settings

MAIN = Path(__file__).resolve().parents[1] / "main.py"


def run_file(s: Settings) -> Path:
    return s.state / "run.json"


def read_run(s: Settings) -> dict:
    p = run_file(s)
    if not p.exists():
        sys.exit(f"kaizen is not running (no {p}); start it with: python main.py up")
    return json.loads(p.read_text())


def pid_alive(pid: int) -> bool:
    """Running (a zombie, dead but not yet reaped by its parent, is not)."""
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def say(msg: str) -> None:
    print(f"[kaizen] {msg}", flush=True)


def up(s: Settings, args) -> int:
    s.state.mkdir(parents=True, exist_ok=True)
    if run_file(s).exists() and pid_alive(json.loads(run_file(s).read_text()).get("pid", -1)):
        sys.exit(f"kaizen is already running from {s.state} (see `python main.py status`)")
    if args.detach:
        return _detach(s, args)

    from config.private import secret_file
    from deploy.nats import EmbeddedNats

    t0 = time.monotonic()
    key_file = s.state / "api_key"
    if not s.serve.api_key:
        s.serve.api_key = secret_file(key_file, lambda: secrets.token_urlsafe(32))
    else:
        key_file = None
    if s.serve.user_keys_file:  # a malformed per-user keys file stops `up` here, naming its line, before anything starts
        from serve.net import load_user_keys

        try:
            say(f"user keys: {len(load_user_keys(s.serve.user_keys_file, s.serve.api_key))} from {s.serve.user_keys_file}")
        except (OSError, ValueError) as exc:
            sys.exit(f"serve.user_keys_file: {exc}")
    stop = asyncio.Event()
    nats_server = None
    if not s.nats.url:
        say("starting nats-server (embedded)")
        nats_server = EmbeddedNats(s.state, s.nats.port, s.nats.user, s.nats.password, host=s.nats.host).start()
        s.nats.url, s.nats.password = nats_server.url, nats_server.password
    try:
        asyncio.run(ensure_stream(s))
        from policies.weights.model_store import ensure_base_model

        say("preparing model")
        base = ensure_base_model(s.state, s.model.source, s.model.path, progress=True)
        from deploy.planner import check

        if (gpu_plan := check(s, base)) is not None:  # exits with the plan when it does not fit
            say("GPU and disk plan:\n" + gpu_plan.table())
        use_own_endpoint(s, f"http://{s.serve.host}:{s.serve.port}/v1")

        from deploy import ray_local

        say("starting Ray")
        ray_local.init_ray(s)
        import ray
        from ray import serve

        if s.ray.node_ip:  # the head of several hosts: they join now, the Serve app may wait for them to place replicas
            say(
                f"join:      python main.py join {ray.get_runtime_context().gcs_address} --node-ip <that host's "
                f"address>   (its state dir holding a copy of {s.state / 'ray_auth_token'})"
            )

        say("starting actors: " + ", ".join(ray_local.ACTORS))
        handles = ray_local.start_actors(s)
        say("starting the Serve app (loading the model in each replica)")
        serve.start(http_options={"host": s.serve.host, "port": s.serve.port}, detached=False)
        from serve.app import build_app

        serve.run(build_app(s, s.serve.api_key), name="kaizen", route_prefix="/", blocking=False)
        _wait_ready(s)
        endpoint = f"http://{s.serve.host}:{s.serve.port}/v1"
        run = {
            "pid": os.getpid(),
            "endpoint": endpoint,
            "model": s.model.name,
            "api_key_file": str(key_file) if key_file else None,
            "nats_url": s.nats.url,
            "nats_user": s.nats.user,
            "gcs_address": ray.get_runtime_context().gcs_address,
            "settings": json.loads(
                s.model_dump_json(
                    exclude={
                        "serve": {"api_key"},
                        "nats": {"password"},
                        "judge": {"api_key"},
                        "questioner": {"generator_api_key"},
                    }
                )
            ),
            "ready_s": round(time.monotonic() - t0, 1),
            "started_at": time.time(),
        }
        _write_private(run_file(s), json.dumps(run, indent=1))
        say(f"ready in {run['ready_s']}s")
        say(f"endpoint:  {endpoint}   (OpenAI-compatible; model {s.model.name!r})")
        say(f"api key:   {key_file if key_file else 'from config/KAIZEN_API_KEY'}")
        say(f"nats:      {s.nats.url} (user {s.nats.user}, password in {s.state / 'nats.password'})")
        say(f"page:      http://{s.serve.host}:{s.serve.port}/page#key=<api key>   (the evolution, live, in a browser)")
        say("events:    python main.py events    status: python main.py status    stop: Ctrl-C or main.py down")

        loop = asyncio.new_event_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        watch = loop.create_task(_supervise_nats(nats_server, stop)) if nats_server else None
        loop.run_until_complete(stop.wait())
        if watch is not None:  # it ends within its round once stop is set (left pending, asyncio complains at exit)
            loop.run_until_complete(watch)
        t_stop = time.monotonic()
        say("stopping: draining actors")
        late = ray_local.stop_actors(handles, timeout_s=10.0)  # `down` kills what is left after 25 s
        if late:
            say(f"  stopped without draining (unacked work is redelivered on the next up): {', '.join(late)}")
        say(f"  actors stopped in {time.monotonic() - t_stop:.1f}s; stopping Serve")
        serve.shutdown()
        say(f"  Serve stopped in {time.monotonic() - t_stop:.1f}s; stopping Ray")
        ray.shutdown()
    finally:
        if nats_server:
            nats_server.stop()
        run_file(s).unlink(missing_ok=True)
        say("stopped")
    return 0


async def _supervise_nats(server, stop: asyncio.Event, every_s: float = 0.5) -> None:
    """Restart the embedded nats-server within a second of its exit, on the same port and store."""
    while not stop.is_set():
        await asyncio.sleep(every_s)
        if stop.is_set() or server.alive():
            continue
        t0 = time.monotonic()
        try:
            code = await asyncio.to_thread(server.revive)
            say(
                f"nats-server exited ({code}); restarted on {server.url} with the same store in "
                f"{time.monotonic() - t0:.1f}s (restart {server.restarts})"
            )
        except Exception as exc:  # try again on the next round
            say(f"nats-server exited and did not restart: {exc}")


def _detach(s: Settings, args) -> int:
    log_dir = s.state / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(MAIN), "up"] + (["--config", args.config] if args.config else [])
    env = {**os.environ, "KAIZEN_STATE_DIR": str(s.state)}
    with open(log_dir / "up.log", "ab") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
        )
    say(f"starting in the background (pid {proc.pid}); log: {log_dir / 'up.log'}")
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"up exited with {proc.returncode}; see {log_dir / 'up.log'}")
        if run_file(s).exists():
            run = json.loads(run_file(s).read_text())
            say(f"ready: {run['endpoint']} (api key in {run['api_key_file']}); stop with: python main.py down")
            return 0
        time.sleep(1)
    sys.exit("up did not become ready within 15 minutes")


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def use_own_endpoint(s: Settings, url: str) -> None:
    """`self` as the judge's or the task writer's endpoint: our own Serve app at `url`, with its API key, asked
    for the served model by its name unless a model is set (our endpoint answers no other name)."""
    if s.judge.base_url == "self":
        s.judge.base_url, s.judge.api_key = url, s.serve.api_key
        s.judge.model = s.judge.model or s.model.name
    if s.questioner.generator_base_url == "self":
        s.questioner.generator_base_url, s.questioner.generator_api_key = url, s.serve.api_key
        s.questioner.generator_model = s.questioner.generator_model or s.model.name


async def ensure_stream(s: Settings, attempts: int = -1) -> None:
    """Create the `EVO` stream (or bring it to `s.nats`); `attempts` bounds the connect (-1: until it answers)."""
    from actors.bus import Bus

    bus = await Bus.from_settings(s.nats, "main").connect(attempts=attempts)
    await bus.close()


def _wait_ready(s: Settings, timeout_s: float = 600) -> None:
    import httpx

    url = f"http://{s.serve.host}:{s.serve.port}/readyz"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} not ready after {timeout_s}s")


def down(s: Settings, run: dict, args) -> int:
    pid = run["pid"]
    if not pid_alive(pid):
        run_file(s).unlink(missing_ok=True)
        say("not running (stale run file removed)")
        return 0
    from deploy.procs import descendants

    t0 = time.monotonic()
    tree = descendants(pid)  # Ray, its workers and nats-server: killed below if the clean stop overruns
    os.kill(pid, signal.SIGTERM)
    while pid_alive(pid) and time.monotonic() - t0 < args.timeout:
        time.sleep(0.25)
    left = [p for p in tree if pid_alive(p) and p != pid] if not pid_alive(pid) else [p for p in tree if pid_alive(p)]
    if left:  # a clean stop that hangs (e.g. on an actor killed before) must not hold the machine
        say(f"clean stop did not finish in {args.timeout:.0f}s: killing {len(left)} processes")
        for p in left:
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while any(pid_alive(p) for p in left) and time.monotonic() < deadline:
            time.sleep(0.1)
        run_file(s).unlink(missing_ok=True)
    say(f"stopped in {time.monotonic() - t0:.1f}s" if not pid_alive(pid) else f"pid {pid} still running")
    return 0 if not pid_alive(pid) else 1
