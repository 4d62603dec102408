"""Two steps of scripts/gpu_check.sh: the models the GPU check needs, and `up` under scripted users.

`models`: the base model converted once into the checkout's `.kaizen/model` (where tests/gpu looks for it), and a
config folder of the Qwen2-7B shape for bench_vllm_swap's dummy weights: 7B's layers (hidden 3584, 28 layers,
28 heads, 4 KV heads, MLP 18944, untied head) with the base model's tokenizer, so its vocabulary is 49152 instead
of 152064 (6.9B parameters instead of 7.6B): no Qwen2 tokenizer exists offline, and every sampled id must decode.

`up`: `main.py up --detach` with a preset (default config/gpu-7b.yaml) whose model is swapped for a small real
one (the converted SmolLM2-135M, `model.source: hf-folder`; `--set key=value` for other overrides), then
bench_learning_curve's scripted users (arithmetic with the python tool, every answer rated) until `--minutes`
or the step's deadline, leaving time for `down`. If no version is served 50 s before the end, the newest one the
gate rejected is made live with `main.py promote --force`, so the promotion path (broadcaster -> replica's vLLM
swap over the chosen transport) runs either way; the JSON says which (a version the gate has not decided yet is
not forced: it would only be queued behind itself). `down` always runs.
Figures: time to ready, requests and failures, learner steps and their seconds, versions published, promoted,
served, replica swap times.

    python tests/benchmarks/gpu_up_check.py models [--state .kaizen] [--config-7b DIR] [--dry-run]
    python tests/benchmarks/gpu_up_check.py up --json F [--preset P] [--model DIR] [--minutes 3] [--deadline-s S]
"""

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

from _common import ROOT  # noqa: E402  (also puts the repository on sys.path)
from _gpu_models import models  # noqa: E402
from _run_logs import tails  # noqa: E402

BASE_DIR = ROOT / ".kaizen" / "model" / "smollm2-135m-instruct"
KINDS = ["learner_step", "weights_published", "weights_promoted", "weights_status", "weights_swapped", "weights_rolled_back"]


def derived_config(a, state: Path) -> Path:
    cfg = yaml.safe_load(Path(a.preset).read_text()) or {}
    model = cfg.setdefault("model", {})
    model.update(source="hf-folder", path=str(Path(a.model).resolve()), name=Path(a.model).name)
    for item in a.set:
        dotted, value = item.split("=", 1)
        *parents, leaf = dotted.split(".")
        node = cfg
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = yaml.safe_load(value)
    path = state.parent / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg))
    return path


def figures_of(events, stats: dict, ready_s, forced: str | None) -> dict:
    """What the run shows, from its events (event models) and the users' counters."""
    by = {k: [e for e in events if e.kind == k] for k in KINDS}
    steps = [e.duration_s for e in by["learner_step"]]
    swaps = [e.swap_ms for e in by["weights_swapped"] if e.reason != "joined"]
    served = served_versions(events)
    return {
        "ready_s": ready_s,
        **{k: stats.get(k, 0) for k in ("requests", "failed", "rated", "right", "tool_right")},
        "traffic_s": stats.get("traffic_s", 0),
        "learner_steps": len(steps),
        "learner_step_s_p50": round(statistics.median(steps), 2) if steps else None,
        "learner_step_s_max": round(max(steps), 2) if steps else None,
        "published": len(by["weights_published"]),
        "promoted_by_gate": len(by["weights_promoted"]),
        "rejected_by_gate": sum(e.status == "rejected" for e in by["weights_status"]),
        "forced_promotion": forced,
        "served_versions": served,
        "rolled_back": len(by["weights_rolled_back"]),
        "replica_swap_ms_p50": round(statistics.median(swaps), 1) if swaps else None,
        "replica_swap_ms_max": round(max(swaps), 1) if swaps else None,
        "last_error": stats.get("last_error", ""),
    }


def served_versions(events) -> dict[str, str]:
    """Every version a replica reported serving, as live or as canary (the base aside): past a promotion."""
    out = {}
    for e in (e for e in events if e.kind == "weights_swapped"):
        out.update({v: role for v, role in ((e.canary, "canary"), (e.version, "live")) if v and v != "w-000000"})
    return out


def force_candidate(events) -> str | None:
    """The newest version the gate has rejected (one still queued or being scored would only be scored again)."""
    last = {e.version: e.status for e in events if e.kind == "weights_status"}
    rejected = [v for v, st in last.items() if st == "rejected"]
    return max(rejected) if rejected else None


def kill_detached(parent: subprocess.Popen, log: Path) -> None:
    """`up --detach` that did not become ready in time: it, and the `up` it started with everything below."""
    import re

    from deploy.procs import descendants

    parent.kill()
    parent.wait()
    found = re.search(r"background \(pid (\d+)\)", log.read_text())
    tree = descendants(int(found.group(1))) if found else []
    for pid in tree:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    print(f"up was not ready in time: killed `up --detach` and {len(tree)} processes of the `up` it started")


def dry_up(a, cfg: Path) -> int:
    """Everything but the processes: the derived preset validates and fits the planner at 78 GiB / 64 GiB with the
    7B shape, the scripted users and the event reader import, the figures come out of no events."""
    from _users import users  # noqa: F401  (the scripted client the real run uses)
    from config.settings import load_settings
    from deploy.nats import free_port
    from deploy.planner import Shape, plan
    from deploy.stream_view import read_events  # noqa: F401

    s = load_settings(cfg)
    shape = Shape.from_config(json.loads(Path(a.plan_config).read_text()))
    p = plan(s, shape, gpu_gib=78, disk_gib=64)
    print(
        f"derived preset {cfg}: model {s.model.path} on {s.model.engine}, transport {s.serve.weights_transport}; "
        f"port {free_port()} free; plan at the {shape.params / 1e9:.1f}B shape fits: {p.fits}"
    )
    out = {**figures_of([], {}, None, None), "dry_run": True, "plan_fits_7b_shape": p.fits, "plan_problems": p.problems}
    Path(a.json).write_text(json.dumps(out))
    return 0 if p.fits else 1


def up(a) -> int:
    t_begin, t_wall = time.monotonic(), time.time()
    deadline = t_begin + a.deadline_s
    state = Path(a.state)
    cfg = derived_config(a, state)
    if a.dry_run:
        return dry_up(a, cfg)
    import openai  # noqa: F401  (fail here, not in a user thread)

    from _users import users
    from config.settings import load_settings
    from deploy.nats import free_port
    from deploy.stream_view import read_events

    s = load_settings(cfg)
    s.state_dir = str(state)
    env = {**os.environ, "KAIZEN_STATE_DIR": str(state), "KAIZEN_SERVE_PORT": str(free_port())}
    main = [sys.executable, str(ROOT / "main.py")]
    stats = {"requests": 0, "rated": 0, "tool_right": 0, "right": 0, "failed": 0}
    stop, forced, ready_s, rc = threading.Event(), None, None, 1

    def on_term(*_):
        raise SystemExit("stopped by the check's time budget")

    signal.signal(signal.SIGTERM, on_term)
    up_log = state.parent / "up-detach.log"
    try:
        left = deadline - time.monotonic() - 40 - 60  # down, and a minute of traffic at least
        with open(up_log, "w") as log:
            r = subprocess.Popen(
                [*main, "up", "--detach", "--config", str(cfg)],
                env=env,
                cwd=ROOT,
                text=True,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            try:
                r.wait(timeout=max(left, 30))
            except subprocess.TimeoutExpired:
                pass  # not ready in time: killed below, then the logs say why
            finally:
                if r.poll() is None or not (state / "run.json").exists():
                    kill_detached(r, up_log)
        print(up_log.read_text()[-4000:], flush=True)
        if r.returncode != 0:
            print(tails(state, since=t_wall), flush=True)
            return 1
        run = json.loads((state / "run.json").read_text())
        ready_s = run.get("ready_s")
        print(f"up ready in {ready_s}s ({time.monotonic() - t_begin:.0f}s with the detach)", flush=True)
        threads = [threading.Thread(target=users, args=(run, stop, stats, a.pause_s, 7 + i), daemon=True) for i in range(a.users)]
        for t in threads:
            t.start()
        t0 = time.monotonic()
        end = min(t0 + a.minutes * 60, deadline - 40)  # `down` returns within ~30 s
        while time.monotonic() < end:
            time.sleep(min(10, max(0.0, end - time.monotonic())))
            try:
                evs = asyncio.run(read_events(s, run, ["weights_published", "weights_status", "weights_swapped"]))
            except Exception as exc:  # the bus answers again at the next look; the run goes on
                print(f"  reading the stream failed: {exc!r}"[:300], flush=True)
                continue
            served, candidate = served_versions(evs), force_candidate(evs)
            print(
                f"  {time.monotonic() - t0:.0f}s: {json.dumps({k: v for k, v in stats.items() if k != 'last_error'})}; "
                f"published {sum(e.kind == 'weights_published' for e in evs)}, served {served}",
                flush=True,
            )
            if forced is None and not served and candidate and time.monotonic() > end - 50:
                forced = candidate
                p = subprocess.run(
                    [*main, "promote", forced, "--force", "--reason", "gpu_check: no gate pass in time"],
                    env=env,
                    cwd=ROOT,
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
                print(f"no version passed the gate: forced {forced} live (rc {p.returncode}) {p.stdout[-300:]}", flush=True)
        stop.set()
        stats["traffic_s"] = round(time.monotonic() - t0)
        for t in threads:
            t.join(timeout=10)
        res = figures_of(asyncio.run(read_events(s, run, KINDS)), stats, ready_s, forced)
        rc = 0 if res["served_versions"] and res["requests"] > res["failed"] else 1
        if rc:
            print(
                "no promoted version was served (a version still in the gate is not forced)"
                if not res["served_versions"]
                else "every request failed"
            )
    finally:
        stop.set()
        if (state / "run.json").exists():
            d = subprocess.run([*main, "down"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
            print("down:", d.stdout[-500:] + d.stderr[-500:], flush=True)
        log = state / "logs" / "up.log"
        if rc and log.exists():
            print(f"--- last lines of {log}:\n" + "\n".join(log.read_text(errors="replace").splitlines()[-40:]))
            if ready_s is not None:  # not ready: printed above
                print(tails(state, since=t_wall), flush=True)
        if "res" not in locals():  # stopped before the end: what is known
            res = figures_of([], stats, ready_s, forced)
        Path(a.json).write_text(json.dumps({**res, "wall_s": round(time.monotonic() - t_begin)}))
        print(json.dumps(res, indent=1))
    return rc


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("models")
    m.add_argument("--state", default=str(ROOT / ".kaizen"))
    m.add_argument("--config-7b", default=str(ROOT / ".gpu-cache" / "qwen2-7b-shape"))
    u = sub.add_parser("up")
    u.add_argument("--preset", default=str(ROOT / "config" / "gpu-7b.yaml"))
    u.add_argument("--model", default=str(BASE_DIR))
    u.add_argument("--set", action="append", default=[], help="preset override KEY=VALUE (dotted key), repeatable")
    u.add_argument("--minutes", type=float, default=3.0)
    u.add_argument("--deadline-s", type=float, default=280, help="the step's budget: traffic ends in time for `down`")
    u.add_argument("--state", default="", help="state dir (default: a new temp dir)")
    u.add_argument("--users", type=int, default=4)
    u.add_argument("--pause-s", type=float, default=2.0)
    u.add_argument(
        "--plan-config",
        default=str(ROOT / ".gpu-cache" / "qwen2-7b-shape" / "config.json"),
        help="dry run: the model config.json the derived preset is planned against",
    )
    for p in (m, u):
        p.add_argument("--json", required=True, help="write the figures here")
        p.add_argument("--dry-run", action="store_true", help="no model conversion, no processes: the plumbing only")
    return ap


if __name__ == "__main__":
    args = parser().parse_args()
    if args.cmd == "up" and not args.state:
        import tempfile

        args.state = str(Path(tempfile.mkdtemp(prefix="kz-gpu-up-")) / "state")
    sys.exit(models(args) if args.cmd == "models" else up(args))
