"""The proof: does the served agent get better on held-out tasks while it runs? (CPU default, real `up`)

Starts `main.py up --detach` on a fresh state dir with the default preset (`--config` to change it;
the only override is `gate.keep_versions`, so that no served version's weights are pruned before they
are scored), then runs scripted users for `--minutes`: a client asks arithmetic questions with the
`python` tool declared, runs the tool calls it gets back in the sandbox (as an agent client would),
and rates every answer by a verifiable rule (+1 when the number is right, -1 otherwise), so live
traffic carries signal too. The questions are drawn fresh (not the environments' held-out entries).
Then it stops `up` and scores the base and every version that was served (canary or live) on the
same fixed held-out suite (`policies/evaluation/heldout.py`: the first `--per-category` held-out entries of
every category, avg@k with k = `--k`), each compared with the base by the paired sign-flip test.
The default suite is fixed before the run: up to 32 entries each of the code ladder's first two rungs
(add, muladd: where the 135M starts near 0 but not beyond reach; the loop rungs are 0 for base and every
version), which is every held-out entry they have (17 + 23 = 40), and 2 of each BFCL category (8 per
rung gave p = 0.076 for a +12.5-point gain: too few entries for the paired test). `--max-versions` bounds the
scoring time (~7 min a version on 2 cores).
Writes JSON and a PNG curve (`--out`, default tests/benchmarks/results/learning_curve_cpu.*) and
prints the lineage table (as `main.py report` does).

`--repeats N` runs N fresh hours back to back (each its own state dir, `up` and scripted users) and writes
`<out>_summary.json`: each hour's newest-vs-base figures, every scored version's, the per-stage cycle, and
the mean and the minimum of the gains. The base is scored once for the set (the same model and seed) and
its scores are reused by the later hours, so every hour is compared with the same base draw.
Each hour's JSON also keeps its learner steps (sources by origin, reward, KL, grad norm) and its live
ratings, for reading why hours differ.

    .venv/bin/python tests/benchmarks/bench_learning_curve.py [--minutes 60] [--k 4] [--per-category code=32]
    .venv/bin/python tests/benchmarks/bench_learning_curve.py --repeats 3 --config PRESET --out results/NAME
"""

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

from _common import ROOT  # noqa: E402  (also puts the repository on sys.path)
from _hours import check_host, host_forward_s, host_limit, repeats, seed_base  # noqa: E402
from _report import report  # noqa: E402
from _users import users  # noqa: E402


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--config", default=str(ROOT / "config" / "cpu.yaml"))
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument(
        "--per-category",
        default="code=32",
        help="held-out entries per category: N, or ENV=N,... "
        "(BFCL, 0 for the 135M base and every version so far, is left out unless named)",
    )
    ap.add_argument(
        "--categories",
        default="code=add,muladd",
        help="only these categories of an environment's held-out split: ENV=CAT,CAT;ENV=... (empty = all)",
    )
    ap.add_argument(
        "--max-versions",
        type=int,
        default=4,
        help="score at most this many served versions, evenly spaced, the newest always (0 = all)",
    )
    ap.add_argument("--user-pause-s", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument(
        "--score-threads",
        type=int,
        default=os.cpu_count() or 1,
        help="torch threads of the scoring engine (`up` is down by then: every core is free)",
    )
    ap.add_argument(
        "--score-batch",
        type=int,
        default=16,
        help="held-out episodes generated together (several entries' k samples in one batch)",
    )
    ap.add_argument("--repeats", type=int, default=1, help="fresh hours back to back; writes <out>_summary.json")
    ap.add_argument(
        "--max-host-forward-s",
        type=float,
        default=None,
        help="stop before anything else runs when the host's forward pass (host_forward_s) is slower than this: "
        "an hour on a much slower host makes fewer steps and is no replicate of the committed ones",
    )
    ap.add_argument(
        "--host-like",
        type=Path,
        default=None,
        help="a committed hour's results JSON this hour is to be paired with: stop, as --max-host-forward-s does, on "
        "a host more than 1.25x slower than that hour's (the tighter of the two limits applies)",
    )
    ap.add_argument(
        "--keep-weights",
        action="store_true",
        help="keep every version's weights file after scoring (by default only the scored ones stay: an hour writes ~50 files)",
    )
    ap.add_argument("--out", default=str(ROOT / "tests" / "benchmarks" / "results" / "learning_curve_cpu"))
    ap.add_argument(
        "--from-run",
        default="",
        help="score a finished run again: its directory (kz-curve-*), "
        "whose stream is read from its stored nats data; the run itself is not repeated",
    )
    return ap


def run(a) -> None:
    if a.from_run:
        return rescore(a)
    if a.repeats > 1:
        return repeats(a, one_hour)
    one_hour(a, a.out)


def one_hour(a, out_path: str) -> dict:
    from config.settings import load_settings
    from deploy.nats import free_port
    from policies.weights.model_store import ensure_base_model

    root = Path(tempfile.mkdtemp(prefix="kz-curve-"))
    state = root / "state"
    cfg = yaml.safe_load(Path(a.config).read_text()) or {}
    cfg.setdefault("gate", {})["keep_versions"] = 10_000
    (root / "config.yaml").write_text(yaml.safe_dump(cfg))
    if (ROOT / ".kaizen" / "model").exists():  # reuse the one-time conversion
        shutil.copytree(ROOT / ".kaizen" / "model", state / "model")
    m = load_settings(root / "config.yaml").model
    host = {"before_up": host_forward_s(ensure_base_model(state, m.source, m.path, progress=False))}  # alone
    try:
        check_host(host["before_up"], host_limit(a.max_host_forward_s, a.host_like))  # before the base is scored
    except SystemExit:
        shutil.rmtree(root, ignore_errors=True)  # nothing ran: no state to keep
        raise
    seed_base(a, root / "config.yaml", state)  # scored once on this machine: the guard and the report find it
    env = {**os.environ, "KAIZEN_STATE_DIR": str(state), "KAIZEN_SERVE_PORT": str(free_port())}
    t_start = time.time()
    up = subprocess.run(
        [sys.executable, str(ROOT / "main.py"), "up", "--detach", "--config", str(root / "config.yaml")],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert up.returncode == 0, up.stdout + up.stderr
    run = json.loads((state / "run.json").read_text())
    print(f"up in {time.time() - t_start:.0f}s; state {state}; scripted users for {a.minutes:.0f} min", flush=True)
    stop, stats = threading.Event(), {"requests": 0, "rated": 0, "tool_right": 0, "right": 0, "failed": 0}
    stats_file = root / "users.json"
    th = threading.Thread(target=getattr(a, "users_fn", users), args=(run, stop, stats, a.user_pause_s, a.seed), daemon=True)
    th.start()
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < a.minutes * 60:
            time.sleep(60)
            print(f"  {(time.monotonic() - t0) / 60:.0f} min: {json.dumps(stats)}", flush=True)
            stats_file.write_text(json.dumps(stats))
        stop.set()
        th.join(timeout=400)
        from deploy import stream_view as cli

        s = load_settings(root / "config.yaml")
        s.state_dir = str(state)
        events = asyncio.run(cli.read_events(s, run, KINDS))
        learner = [e for e in events if e.kind == "learner_step"]
    finally:
        subprocess.run([sys.executable, str(ROOT / "main.py"), "down"], env=env, cwd=ROOT, capture_output=True, timeout=600)
    return report(a, s, state, events, learner, stats, time.time() - t_start, out_path, host)


KINDS = [
    "judgement",
    "learner_step",
    "weights_published",
    "weights_status",
    "weights_promoted",
    "weights_rolled_back",
    "heldout_scored",
]


def rescore(a) -> None:
    """Read a finished run's events from its stored stream (a nats-server on its store) and score it."""
    from config.settings import load_settings
    from deploy import stream_view as cli
    from deploy.nats import EmbeddedNats

    root = Path(a.from_run)
    state = root / "state"
    s = load_settings(root / "config.yaml")
    s.state_dir = str(state)
    server = EmbeddedNats(state).start()
    try:
        run = {"nats_url": server.url, "nats_user": server.user}
        events = asyncio.run(cli.read_events(s, run, KINDS))
    finally:
        server.stop()
    stats = json.loads((root / "users.json").read_text()) if (root / "users.json").exists() else {}
    learner = [e for e in events if e.kind == "learner_step"]
    report(a, s, state, events, learner, stats, None, a.out)


if __name__ == "__main__":
    run(parser().parse_args())
