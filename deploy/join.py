"""`join`: this host becomes a Ray worker node of a Kaizen head on another host, and ends with it.

The head is a `main.py up` whose config sets `ray.node_ip` (and `nats.host`) to an address this host reaches;
it prints the line to run here. This host needs its own state dir with the base model (or `model.source:
hf-folder`) and a copy of the head's `ray_auth_token` (Ray's token auth, as `up` uses it): nothing else is
shared. The head's Serve app places replicas here (`serve.max_replicas_per_node: 1` spreads them); they read
weights versions from the bus (`weights.store: nats`) into this host's state dir.

`join` runs `ray start --block` as a child it owns, with the environment `up` gives its own Ray (no usage
stats, one thread per worker, token auth from this state dir). It watches the head's address: when the head has
not answered for `--head-grace` seconds (a `down` or a crash there), or on Ctrl-C / SIGTERM here, it stops its
Ray node (`_stop`: SIGTERM, then SIGKILL to what is left of the processes below it) and returns.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from config.settings import Settings
from deploy.launch import pid_alive, say
from deploy.procs import descendants


def ray_binary() -> str:
    cand = Path(sys.executable).parent / "ray"
    return str(cand) if cand.exists() else "ray"


def worker_env(s: Settings) -> dict[str, str]:
    """`up`'s Ray environment for a worker node: the same, except that a worker node must not be held to loopback
    (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 would refuse `ray start --address`)."""
    from deploy.ray_local import process_env

    env = process_env(s.state)
    env.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
    return env


def start_command(s: Settings, address: str, node_ip: str, num_cpus: int, num_gpus: int) -> list[str]:
    cmd = [
        ray_binary(),
        "start",
        f"--address={address}",
        f"--node-ip-address={node_ip}",
        f"--num-cpus={num_cpus}",
        f"--num-gpus={num_gpus}",
        "--block",
        "--disable-usage-stats",
    ]
    temp = s.state / "ray"
    if len(str(temp)) <= 40:  # unix socket paths are short (as for `up`'s own Ray)
        cmd.append(f"--temp-dir={temp}")
    return cmd


def head_answers(address: str, timeout_s: float = 2.0) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
        return True
    except OSError:
        return False


def join(s: Settings, args) -> int:
    token = s.state / "ray_auth_token"
    if not token.exists():  # process_env would make a new one, which the head would refuse
        sys.exit(f"no {token}: copy the head's <state dir>/ray_auth_token here first (mode 0600)")
    if not head_answers(args.address, 5.0):
        sys.exit(f"the head at {args.address} does not answer")
    (s.state / "logs").mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **worker_env(s)}
    cmd = start_command(s, args.address, args.node_ip, args.num_cpus, args.num_gpus)
    with open(s.state / "logs" / "join.log", "ab") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
        )
    say(f"joining {args.address} as {args.node_ip} (ray start pid {proc.pid}, log {s.state / 'logs' / 'join.log'})")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    tree: list[int] = []
    silent_since = None
    head_gone = False
    while not stop.is_set() and proc.poll() is None:
        tree = [p for p in descendants(proc.pid) if p != proc.pid] or tree  # what to end if `ray start` goes first
        if head_answers(args.address):
            silent_since = None
        elif silent_since is None:
            silent_since = time.monotonic()
        elif time.monotonic() - silent_since > args.head_grace:
            say(f"the head at {args.address} has not answered for {args.head_grace:.0f}s: stopping this node")
            head_gone = True
            break
        stop.wait(1.0)
    ended = proc.poll()  # `ray start` ended by itself (it could not join, or its node failed)
    _stop(proc, tree, head_gone)
    if ended:
        say(f"ray start exited with {ended}: see {s.state / 'logs' / 'join.log'}")
    return 1 if ended else 0


def _stop(proc: subprocess.Popen, tree: list[int], head_gone: bool, timeout_s: float = 40.0) -> None:
    """With the head there (Ctrl-C here): SIGTERM to `ray start`, which drains the node (the head's Serve moves its
    replicas away first) and ends its processes. With the head gone there is nothing to drain for (the drain asks the
    head's GCS and would wait out its 30 s), so `ray start` is killed and the node's processes get SIGTERM.
    SIGKILL to whatever still runs after that."""
    t0 = time.monotonic()
    tree = sorted(set(tree) | set(descendants(proc.pid)) - {proc.pid})
    if proc.poll() is None and head_gone:
        proc.kill()
        proc.wait()
        for p in tree:
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGTERM)
    elif proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    left = [p for p in tree if pid_alive(p)]
    deadline = time.monotonic() + 10
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = [p for p in left if pid_alive(p)]
    for p in left:
        with contextlib.suppress(OSError):
            os.kill(p, signal.SIGKILL)
    say(f"node stopped in {time.monotonic() - t0:.1f}s" + (f" ({len(left)} processes killed)" if left else ""))
