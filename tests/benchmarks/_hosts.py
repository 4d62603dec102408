"""Hosts on one machine for tests/benchmarks/two_hosts.py: a network namespace each, joined by a veth pair, and a
mount namespace per command in which the host's own directory is bound at the one state-dir path every host uses.

So the hosts share the kernel, the CPUs and the read-only files (the repository, the venv), and nothing else that
the system writes: each has its own loopback and address, its own ports, its own state dir (weights, logs, Ray's
session and sockets). Every process a host runs is in its network namespace, so `ip netns pids` lists exactly
what it runs, and tearing a host down kills exactly those (nothing is found or killed by name). Needs root,
iproute2 and util-linux's `unshare`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=check, capture_output=True, text=True)


def missing() -> str | None:
    """Why hosts cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "needs root (network and mount namespaces)"
    for tool in ("ip", "unshare", "curl"):
        if shutil.which(tool) is None:
            return f"needs `{tool}`"
    return None


class Host:
    def __init__(self, name: str, ns: str, addr: str, real: Path, state: Path):
        self.name, self.ns, self.addr, self.real, self.state = name, ns, addr, real, state

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv` run on this host: in its network namespace, with its directory bound at the state-dir path."""
        return [
            "ip",
            "netns",
            "exec",
            self.ns,
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            'mount --bind "$1" "$2" && shift 2 && exec "$@"',
            "sh",
            str(self.real),
            str(self.state),
            *argv,
        ]

    def run(self, argv: list[str], env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
        return subprocess.run(self.wrap(argv), env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=timeout)

    def popen(self, argv: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
        with open(log, "ab") as f:
            return subprocess.Popen(
                self.wrap(argv),
                env={**os.environ, **(env or {})},
                stdout=f,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def http(self, port: int, path: str, key: str = "", body: dict | None = None, timeout: float = 60) -> tuple[int, dict]:
        """(status, JSON body) of a request to this host's loopback (its own Serve proxy); (0, {}) when none."""
        argv = [
            "ip",
            "netns",
            "exec",
            self.ns,
            "curl",
            "-sS",
            "-m",
            str(timeout),
            "-w",
            "\n%{http_code}",
            f"http://127.0.0.1:{port}{path}",
        ]
        if key:
            argv += ["-H", f"Authorization: Bearer {key}"]
        if body is not None:
            argv += ["-H", "Content-Type: application/json", "--data-binary", json.dumps(body)]
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout + 10).stdout
        except subprocess.TimeoutExpired:
            return 0, {}
        text, _, code = out.rpartition("\n")
        try:
            return int(code or 0), json.loads(text) if text.strip() else {}
        except ValueError:
            return int(code or 0), {"text": text[:500]}

    def pids(self) -> list[int]:
        return [int(p) for p in sh("ip", "netns", "pids", self.ns, check=False).stdout.split()]

    def processes(self, prefix: str) -> list[int]:
        """This host's processes whose name starts with `prefix` (Ray names its workers `ray::<class>`)."""
        out = []
        for pid in self.pids():
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip().startswith(prefix[:15]):
                    out.append(pid)
            except OSError:
                pass
        return out

    def kill_all(self, timeout_s: float = 10.0) -> int:
        """SIGKILL every process in this host's network namespace (all started by this script); how many."""
        pids = self.pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        deadline = time.monotonic() + timeout_s
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.2)
        return len(pids)


def hosts(tag: str, work: Path, subnet: str = "10.77.0") -> tuple[Host, Host]:
    """Hosts a and b at <subnet>.1 and .2, directories work/a and work/b bound at work/state (nothing made yet)."""
    return tuple(
        Host(name, f"kz2h{tag}{name}", f"{subnet}.{i}", work / name, work / "state") for i, name in enumerate("ab", start=1)
    )


def wire(tag: str, a: Host, b: Host) -> None:
    """Their directories, namespaces and the veth pair between them."""
    for host in (a, b):
        host.real.mkdir(parents=True, exist_ok=True)
        host.state.mkdir(parents=True, exist_ok=True)
    va, vb = f"kv{tag}a", f"kv{tag}b"
    sh("ip", "netns", "add", a.ns)
    sh("ip", "netns", "add", b.ns)
    sh("ip", "link", "add", va, "type", "veth", "peer", "name", vb)
    for host, dev in ((a, va), (b, vb)):
        sh("ip", "link", "set", dev, "netns", host.ns)
        sh("ip", "-n", host.ns, "addr", "add", f"{host.addr}/24", "dev", dev)
        sh("ip", "-n", host.ns, "link", "set", dev, "up")
        sh("ip", "-n", host.ns, "link", "set", "lo", "up")


def remove_hosts(tag: str, hosts: tuple[Host, ...]) -> dict:
    """Kill what runs on each host, delete the namespaces (their veth ends go with them) and any veth left here."""
    killed = {h.name: h.kill_all() for h in hosts if h.ns in sh("ip", "netns", "list").stdout}
    for h in hosts:
        sh("ip", "netns", "del", h.ns, check=False)
    for dev in (f"kv{tag}a", f"kv{tag}b"):
        sh("ip", "link", "del", dev, check=False)
    return killed
