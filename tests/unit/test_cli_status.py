"""`main.py status` answers, and says so, when the bus is down (it once hung for minutes)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from deploy.nats import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_status_reports_a_bus_that_is_down(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (state / "api_key").write_text("k")
    (state / "run.json").write_text(
        json.dumps(
            {
                "pid": os.getpid(),
                "endpoint": f"http://127.0.0.1:{free_port()}/v1",
                "api_key_file": str(state / "api_key"),
                "nats_url": f"nats://127.0.0.1:{free_port()}",
                "nats_user": "kaizen",
            }
        )
    )
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, str(ROOT / "main.py"), "status", "--json", "--no-actors"],
        cwd=ROOT,
        env={**os.environ, "KAIZEN_STATE_DIR": str(state)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["bus"].startswith("down") and out["served_weights_version"].startswith("unreachable")
    assert took < 30, took  # generous for a loaded CI machine; the benchmark reports the real figure


def test_down_kills_what_does_not_stop(tmp_path):
    """A process tree that ignores SIGTERM (an `up` stuck on an actor killed before): `down` kills it after
    its timeout instead of waiting forever."""
    state = tmp_path / "state"
    state.mkdir()
    stubborn = (
        "import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "subprocess.Popen([sys.executable, '-c', 'import signal, time; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)']); time.sleep(600)"
    )
    proc = subprocess.Popen([sys.executable, "-c", stubborn])
    time.sleep(1.0)
    from deploy.procs import descendants

    tree = descendants(proc.pid)
    assert len(tree) == 2
    (state / "run.json").write_text(json.dumps({"pid": proc.pid, "endpoint": "http://127.0.0.1:1/v1"}))
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, str(ROOT / "main.py"), "down", "--timeout", "2"],
        cwd=ROOT,
        env={**os.environ, "KAIZEN_STATE_DIR": str(state)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    took = time.monotonic() - t0
    proc.wait(10)  # reap our child (init reaps the grandchild)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "killing 2 processes" in r.stdout and took < 20
    from deploy.launch import pid_alive

    assert not any(pid_alive(p) for p in tree) and not (state / "run.json").exists()


def test_status_parts_are_asked_at_once_and_a_hung_one_is_reported_not_waited_for():
    """A loaded machine once made one part of `status` (Ray, or the held-out cache) so slow that the whole
    command hit its watchdog and printed nothing; now every part runs at once within one budget."""
    import threading

    from deploy.console import NoAnswer, _gather

    release = threading.Event()
    t0 = time.monotonic()
    got, took = _gather(
        {
            "fast": lambda: {"ok": 1},
            "slow": lambda: (time.sleep(0.3), "done")[1],
            "hung": lambda: release.wait(60),
            "broken": lambda: 1 / 0,
        },
        budget_s=1.0,
    )
    elapsed = time.monotonic() - t0
    release.set()
    assert got["fast"] == {"ok": 1} and got["slow"] == "done"
    assert isinstance(got["hung"], NoAnswer) and "1 s" in str(got["hung"]) and took["hung"] is None
    assert isinstance(got["broken"], ZeroDivisionError)
    assert 0.3 <= took["slow"] < 1.0 and 0.9 <= elapsed < 5.0, (took, elapsed)
