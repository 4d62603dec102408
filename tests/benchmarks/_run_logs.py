"""What a failed `up` left in its logs, in a few lines each: the actors' and Serve's own logs under the state dir,
Ray's worker logs that hold an error (a vLLM engine's start-up writes there: the actor's stdout and stderr), and
the warnings of Serve's controller (a replica that cannot be placed or keeps failing its start says so there)."""

from __future__ import annotations

import re
from pathlib import Path

LEVEL = re.compile(r"(^| )(WARNING|ERROR) ")
ERROR = re.compile(r"Traceback|Error|error:|CUDA out of memory|RuntimeError|AssertionError")


def tails(state: Path, lines: int = 12, workers: int = 4, since: float = 0.0) -> str:
    """The last `lines` of every log in state/logs but up.log, then the last 2x`lines` of the `workers` newest Ray
    worker logs (state/ray, or /tmp/ray's session if it began after `since`, a time.time()) that mention an error."""
    out = []
    for log in sorted((state / "logs").glob("*.log")):
        if log.name != "up.log":
            out += [f"--- {log} (last {lines} lines):", *log.read_text(errors="replace").splitlines()[-lines:]]
    dirs = [
        d / "session_latest" / "logs"
        for d in (state / "ray", Path("/tmp/ray"))
        if (d / "session_latest").exists() and (d == state / "ray" or (d / "session_latest").lstat().st_mtime >= since)
    ]
    found = sorted((f for d in dirs[:1] for f in d.glob("worker-*")), key=lambda f: f.stat().st_mtime, reverse=True)
    bad = [f for f in found if f.suffix in (".err", ".out") and ERROR.search(f.read_text(errors="replace"))]
    for f in bad[:workers]:
        out += [f"--- {f} (last {2 * lines} lines):", *f.read_text(errors="replace").splitlines()[-2 * lines :]]
    if dirs and not bad:
        out.append(f"--- no Ray worker log in {dirs[0]} mentions an error")
    for f in (
        sorted(dirs[0].glob("serve/controller_*.log"), key=lambda f: f.stat().st_mtime)[-1:] if dirs else []
    ):  # e.g. a replica Ray cannot place
        said = [ln for ln in f.read_text(errors="replace").splitlines() if LEVEL.search(ln)]
        out += [f"--- {f}: its last {2 * lines} warnings and errors:", *said[-2 * lines :]]
    return "\n".join(out)
