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
    (state / "run.json").write_text(json.dumps({
        "pid": os.getpid(), "endpoint": f"http://127.0.0.1:{free_port()}/v1", "api_key_file": str(state / "api_key"),
        "nats_url": f"nats://127.0.0.1:{free_port()}", "nats_user": "kaizen"}))
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, str(ROOT / "main.py"), "status", "--json", "--no-actors"], cwd=ROOT,
                       env={**os.environ, "KAIZEN_STATE_DIR": str(state)}, capture_output=True, text=True, timeout=60)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["bus"].startswith("down") and out["served_weights_version"].startswith("unreachable")
    assert took < 30, took  # generous for a loaded CI machine; the benchmark reports the real figure
