"""Serving under load and faults, on a real `up` (CPU default): batching, users first, no failed request,
no lost event.

Starts `main.py up --detach` on a fresh state dir, then, side by side in one run:
1. loop paused (the loop's actor processes stopped with SIGSTOP; the navigator keeps answering memory):
   the raw engine in this process, batches of `--clients` prompts of `--max-tokens` tokens; then one
   client, then `--clients` clients through the OpenAI API, `--phase-s` each: aggregate tokens/s,
   p50 latency. Targets: clients/one >= 3x, clients/raw engine >= 0.8x.
2. loop running (SIGCONT): one client again. Target: its p50 <= 1.5x the paused one (users first), with
   the guard generating in the background meanwhile (it scores the base from the start of `up`; its health
   before and after the phase is recorded).
3. `--minutes` of `--clients` clients at saturation with the loop running; every answer is rated
   (feedback); a forced weights swap every `--swap-every-s` (two versions written at start,
   alternated with `main.py promote --force`; the loop's own promotions come on top); at 40% a
   kill -9 of nats-server, at 60% a kill -9 of the explorer's process. Prints requests, failures
   (target 0), p50/p99, tokens/s, how long nats-server and the actor took to come back, and events
   lost (served interactions and accepted feedback missing from the stream after the outbox
   drained; target 0) and duplicated.
Finally `main.py down`, timed (target <= 30 s). Writes JSON (`--out`).

    .venv/bin/python tests/benchmarks/bench_load.py [--minutes 10] [--clients 8] [--phase-s 45] [--no-faults]
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

from _common import ROOT  # noqa: E402  (also puts the repository on sys.path)
from _load_clients import QUESTIONS, Clients, summary  # noqa: E402


def cli(env, *args, timeout=300):
    return subprocess.run(
        [sys.executable, str(ROOT / "main.py"), *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def raw_engine(model_dir: Path, n: int, max_tokens: int, seconds: float) -> dict:
    """The replica's engine without the server: batches of `n` of the same prompts, generated back to back."""
    from actors.events import ChatMessage
    from policies.chat import render
    from policies.engines.engine import TransformersEngine

    eng = TransformersEngine(model_dir, threads=1)
    prompts = [render([ChatMessage(role="user", content=QUESTIONS[i % len(QUESTIONS)])]) for i in range(n)]
    eng.generate(prompts[:1], 4, temperature=0.7)  # warm
    tokens, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < seconds:
        tokens += sum(g.completion_tokens for g in eng.generate(prompts, max_tokens, temperature=0.7))
    return {"tokens_per_s": round(tokens / (time.monotonic() - t0), 2), "batch": n}


def loop_pids(env) -> dict[str, int]:
    st = json.loads(cli(env, "status", "--json", timeout=120).stdout)
    return {name: a["pid"] for name, a in st["actors"].items() if isinstance(a, dict) and a.get("pid")}


def guard_health(env) -> dict | None:
    st = json.loads(cli(env, "status", "--json", timeout=120).stdout or "{}")
    return (st.get("actors", {}).get("broadcaster") or {}).get("guard")


def signal_loop(pids: dict[str, int], sig) -> None:
    for name, pid in pids.items():
        if name != "navigator":  # memory for live requests is part of serving
            os.kill(pid, sig)


def nats_pids(up_pid: int) -> list[int]:
    from deploy.procs import descendants

    out = []
    for p in descendants(up_pid):
        try:
            if open(f"/proc/{p}/comm").read().strip() == "nats-server":
                out.append(p)
        except OSError:
            pass
    return out


def fault_run(a, env, run, s, versions, out) -> None:
    """Phase 3: `--minutes` of clients at saturation with forced swaps and kills, then every served interaction and
    accepted feedback looked up on the stream."""
    many = Clients(run, a.clients, a.max_tokens, rate=True)
    faults: dict = {"swaps_forced": 0}
    stop = threading.Event()

    def swapper():
        i = 0
        while not stop.wait(a.swap_every_s):
            r = cli(env, "promote", versions[i % 2], "--force", "--reason", "bench_load swap", timeout=120)
            faults["swaps_forced"] += r.returncode == 0
            i += 1

    def killer():
        total = a.minutes * 60
        if stop.wait(0.4 * total):
            return
        (old,) = nats_pids(run["pid"])
        os.kill(old, signal.SIGKILL)
        t0 = time.monotonic()
        while not [p for p in nats_pids(run["pid"]) if p != old] and time.monotonic() - t0 < 120:
            time.sleep(0.05)
        faults["nats_restarted_s"] = round(time.monotonic() - t0, 2)
        t1 = time.monotonic()
        st = cli(env, "status", "--json", "--no-actors", timeout=60)
        faults["status_during_restart_s"] = round(time.monotonic() - t1, 2)
        faults["status_bus"] = json.loads(st.stdout).get("bus", "?")[:80] if st.returncode == 0 else st.stderr[-200:]
        if stop.wait(0.2 * total):
            return
        victim = loop_pids(env).get("explorer")
        os.kill(victim, signal.SIGKILL)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 300:
            now = loop_pids(env).get("explorer")
            if now and now != victim:
                faults["actor_back_s"] = round(time.monotonic() - t0, 1)
                break
            time.sleep(2)

    threads = [threading.Thread(target=f, daemon=True) for f in (swapper, killer)]
    for t in threads:
        t.start()
    recs = many.run_for(a.minutes * 60)
    stop.set()
    out["fault_run"] = {
        **summary(recs, many.wall),
        **faults,
        "feedback_not_202": sum(1 for r in recs if r["ok"] and r["feedback"] != 202),
    }
    print("fault run", out["fault_run"], flush=True)

    # every served interaction and accepted feedback on the stream, once
    import httpx

    ready_url = run["endpoint"].replace("/v1", "/readyz")
    for _ in range(120):
        ready = httpx.get(ready_url, timeout=10).json()
        if ready.get("outbox") == 0 and ready.get("bus") == "connected":
            break
        time.sleep(1)
    import asyncio

    sys.argv = ["main.py"]
    from deploy import stream_view as cli_mod

    events = asyncio.run(cli_mod.read_events(s, run, ["interaction", "feedback", "weights_swapped"]))
    inter = [e.interaction_id for e in events if e.kind == "interaction"]
    fb = [e.interaction_id for e in events if e.kind == "feedback"]
    served = [r["id"] for r in recs if r["ok"]]
    rated = [r["id"] for r in recs if r["feedback"] == 202]
    swaps = [e for e in events if e.kind == "weights_swapped" and e.reason != "joined"]
    out["events"] = {
        "interactions_served": len(served),
        "interactions_lost": len(set(served) - set(inter)),
        "interactions_duplicated": len(inter) - len(set(inter)),
        "feedback_accepted": len(rated),
        "feedback_lost": len(set(rated) - set(fb)),
        "feedback_duplicated": len(fb) - len(set(fb)),
        "replica_swaps": len(swaps),
    }
    print("events", out["events"], flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--phase-s", type=float, default=45)
    ap.add_argument("--swap-every-s", type=float, default=110)
    ap.add_argument("--config", default=str(ROOT / "config" / "cpu.yaml"))
    ap.add_argument(
        "--faults",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="--no-faults: stop after phase 2 (users first), without the fault run",
    )
    ap.add_argument("--out", default=str(ROOT / "tests" / "benchmarks" / "results" / "load_cpu.json"))
    a = ap.parse_args()
    import torch

    from config.settings import load_settings
    from deploy.nats import free_port
    from policies.weights.model_store import WeightsStore, ensure_base_model, version_name

    root = Path(tempfile.mkdtemp(prefix="kz-load-"))
    state = root / "state"
    cfg = yaml.safe_load(Path(a.config).read_text()) or {}
    (root / "config.yaml").write_text(yaml.safe_dump(cfg))
    if (ROOT / ".kaizen" / "model").exists():
        shutil.copytree(ROOT / ".kaizen" / "model", state / "model")
    env = {**os.environ, "KAIZEN_STATE_DIR": str(state), "KAIZEN_SERVE_PORT": str(free_port())}
    up = cli(env, "up", "--detach", "--config", str(root / "config.yaml"), timeout=1200)
    assert up.returncode == 0, up.stdout + up.stderr
    run = json.loads((state / "run.json").read_text())
    s = load_settings(root / "config.yaml")
    s.state_dir = str(state)
    base = ensure_base_model(s.state, s.model.source, s.model.path, progress=False)
    out: dict = {"clients": a.clients, "max_tokens": a.max_tokens, "phase_s": a.phase_s, "minutes": a.minutes}
    try:
        # two versions to swap between: the base weights and a copy with 0.1% noise (harmless, different bytes)
        from safetensors.torch import load_file

        store = WeightsStore(s.state)
        sd = {k: v.to(torch.bfloat16) for k, v in load_file(str(Path(base) / "model.safetensors")).items()}
        torch.manual_seed(0)
        noisy = {k: (v.float() * (1 + 1e-3 * torch.randn_like(v.float()))).to(torch.bfloat16) for k, v in sd.items()}
        versions = []
        for weights in (sd, noisy):
            v = version_name(store.latest_number() + 1)
            store.save(weights, v, {"parent": "w-000000", "step": 0, "note": "bench_load swap version"})
            versions.append(v)
        pids = loop_pids(env)
        print(f"up; loop actors {pids}; swap versions {versions}", flush=True)

        signal_loop(pids, signal.SIGSTOP)
        try:
            out["raw_engine"] = raw_engine(Path(base), a.clients, a.max_tokens, a.phase_s)
            print("raw engine", out["raw_engine"], flush=True)
            one = Clients(run, 1, a.max_tokens, rate=False)
            out["one_client_loop_paused"] = summary(one.run_for(a.phase_s), one.wall)
            print("1 client, loop paused", out["one_client_loop_paused"], flush=True)
            many = Clients(run, a.clients, a.max_tokens, rate=False)
            out["clients_loop_paused"] = summary(many.run_for(a.phase_s), many.wall)
            print(f"{a.clients} clients, loop paused", out["clients_loop_paused"], flush=True)
        finally:
            signal_loop(pids, signal.SIGCONT)
        time.sleep(20)  # the loop picks up again
        guard = [guard_health(env)]  # whether the guard generates meanwhile (scoring the base, or a version)
        one = Clients(run, 1, a.max_tokens, rate=False)
        out["one_client_loop_running"] = summary(one.run_for(a.phase_s), one.wall)
        out["guard_while_loop_running"] = guard + [guard_health(env)]
        print("1 client, loop running", out["one_client_loop_running"], "guard", out["guard_while_loop_running"], flush=True)

        if a.faults:
            fault_run(a, env, run, s, versions, out)
    finally:
        t0 = time.monotonic()
        d = cli(env, "down", timeout=120)
        out["down_s"] = round(time.monotonic() - t0, 1)
        print(d.stdout.strip()[-300:], flush=True)
    p, c = out.get("one_client_loop_paused", {}), out.get("clients_loop_paused", {})
    r, e = out.get("one_client_loop_running", {}), out.get("raw_engine", {})
    if p.get("tokens_per_s") and c.get("tokens_per_s"):
        out["ratios"] = {
            "clients_vs_one": round(c["tokens_per_s"] / p["tokens_per_s"], 2),
            "clients_vs_raw_engine": round(c["tokens_per_s"] / e["tokens_per_s"], 2),
            "p50_loop_running_vs_paused": round(r["p50_s"] / p["p50_s"], 2) if r.get("p50_s") else None,
        }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(json.dumps(out.get("ratios", {})), f"down {out['down_s']}s; written {a.out}")


if __name__ == "__main__":
    main()
