"""`main.py eval` on the real model: the table, the JSON and the PNG chart."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_eval_prints_table_and_writes_json_and_png(tmp_path, model_dir):
    state = tmp_path / "state"
    shutil.copytree(model_dir, state / "model" / "smollm2-135m-instruct")
    env = {**os.environ, "KAIZEN_STATE_DIR": str(state)}
    r = subprocess.run(
        [sys.executable, str(ROOT / "main.py"), "eval", "--env", "code", "--n", "1"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [line.split() for line in r.stdout.splitlines()]
    rows = [x for x in lines if x and x[0] == "code"]
    from envs.code import FAMILIES

    assert {x[1] for x in rows} == {*FAMILIES, "all"}  # every rung of the ladder
    report = json.loads((state / "evals" / "w-000000-k1.json").read_text())
    assert set(report["envs"]["code"]["entries"]) and 0.0 <= report["envs"]["code"]["avg"] <= 1.0
    assert (state / "evals" / "w-000000-k1.png").read_bytes()[:4] == b"\x89PNG"
    bad = subprocess.run(
        [sys.executable, str(ROOT / "main.py"), "eval", "--version", "w-999999"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode != 0 and "unknown weights version" in bad.stderr
