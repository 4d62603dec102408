"""Run untrusted Python in a subprocess with hard limits.

Limits (all enforced by the kernel, not by Python): CPU seconds (RLIMIT_CPU), address space
(RLIMIT_AS), processes (RLIMIT_NPROC, effective because a root parent drops the child to an
unprivileged uid), output size (stdout/stderr go to files capped by RLIMIT_FSIZE), open files,
a wall-clock timeout that kills the child's whole process group, no network (a fresh network
namespace when the kernel allows it), an empty temporary working directory and an isolated
interpreter (`-I`: no site-packages of ours, no environment variables).
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

CLONE_NEWNET = 0x40000000
NOBODY = 65534


@dataclass
class Limits:
    wall_s: float = 5.0
    cpu_s: int = 3
    memory_bytes: int = 256 * 1024 * 1024
    max_procs: int = 8
    output_bytes: int = 64 * 1024
    max_code_chars: int = 20_000


@dataclass
class RunResult:
    stdout: str
    stderr: str
    exit_code: int | None
    timed_out: bool
    killed_by: str | None  # "wall", "cpu", "memory", "output", "signal N"
    seconds: float
    network_isolated: bool

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


def _interpreter() -> tuple[str, bool]:
    """(python, drop_privileges). As root, a system interpreter that an unprivileged uid can execute
    is used so the child can drop to `nobody` (the only way RLIMIT_NPROC binds)."""
    if os.geteuid() == 0:
        for cand in ("/usr/bin/python3", "/bin/python3", "/usr/local/bin/python3"):
            if os.path.exists(cand) and os.stat(os.path.realpath(cand)).st_mode & 0o001:
                return cand, True
    return sys.executable, False


def _can_isolate_network() -> bool:
    return sys.platform.startswith("linux") and os.geteuid() == 0


def _child_setup(limits: Limits, isolate_net: bool, workdir: str, drop: bool):
    def setup():
        os.setsid()
        if isolate_net:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.unshare(CLONE_NEWNET)  # best effort: a fresh netns has only a down loopback
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
        resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.output_bytes, limits.output_bytes))
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_NPROC, (limits.max_procs, limits.max_procs))
        if drop:  # RLIMIT_NPROC does not bind root: drop to nobody
            os.chown(workdir, NOBODY, NOBODY)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)

    return setup


def _kill_group(pgid: int, rounds: int = 200) -> None:
    """SIGKILL the group until it is empty: a child forked while the signal goes out survives one round."""
    for _ in range(rounds):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            return
        except PermissionError:
            return
        time.sleep(0.005)


def run_python(code: str, limits: Limits | None = None) -> RunResult:
    limits = limits or Limits()
    if len(code) > limits.max_code_chars:
        return RunResult(
            "", f"code is {len(code)} characters; the limit is {limits.max_code_chars}", None, False, "size", 0.0, False
        )
    isolate = _can_isolate_network()
    python, drop = _interpreter()
    with tempfile.TemporaryDirectory(prefix="kaizen-sbx-") as work:
        os.chmod(work, 0o777)
        src = os.path.join(work, "main.py")
        with open(src, "w") as f:
            f.write(code)
        out_path, err_path = os.path.join(work, ".out"), os.path.join(work, ".err")
        t0 = time.monotonic()
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(
                [python, "-I", "-B", src],
                cwd=work,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                close_fds=True,
                preexec_fn=_child_setup(limits, isolate, work, drop),
            )
            timed_out = False
            try:
                proc.wait(limits.wall_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            proc.poll()
            _kill_group(proc.pid)  # the whole group goes, including anything the code forked
            proc.wait()
        elapsed = time.monotonic() - t0
        stdout = open(out_path, "rb").read(limits.output_bytes).decode("utf-8", "replace")
        stderr = open(err_path, "rb").read(limits.output_bytes).decode("utf-8", "replace")
    rc = proc.returncode
    killed = "wall" if timed_out else None
    if rc is not None and rc < 0 and not timed_out:
        sig = -rc
        killed = {signal.SIGXCPU: "cpu", signal.SIGKILL: "cpu", signal.SIGXFSZ: "output"}.get(sig, f"signal {sig}")
    elif "MemoryError" in stderr:
        killed = "memory"
    return RunResult(stdout, stderr[-4000:], rc, timed_out, killed, elapsed, isolate and drop)
