"""Two hosts on one machine: a promoted version, feedback, a killed replica and `down`, across hosts that share
nothing on disk (issue 29, item 2).

Host a (10.77.0.1) runs `main.py up` as the head of several hosts: nats-server and Ray listen on its address
(`nats.host`, `ray.node_ip`), the six actors run there, weights versions travel through the bus (`weights.store:
nats`) and the Serve app has two replicas, at most one per node. Host b (10.77.0.2) runs `main.py join`: a Ray
worker node, where the head's Serve places the second replica and an HTTP proxy. Each host has its own network
namespace and its own directory bound at the one state-dir path (tests/benchmarks/_hosts.py): b's replica finds
the base model in b's directory (copied there beforehand, as an image would hold it) and fetches weights into it.
The checks, each with its figures:
  1. promoted: a version made on a (the base weights, one tensor scaled by 1.01, saved as the learner saves, so
     into the bus's object store) and forced live with `main.py promote --force` is served by b's replica: b's
     proxy answers with it, from the copy b fetched into its own state dir and verified;
  2. feedback: an interaction answered by a's replica and rated through b's proxy (b's replica finds it on the
     stream) reaches the learner on a: `status` shows a live judgement held for its group;
  3. restart: kill -9 of b's replica: Serve starts another one on b, which serves the live version;
  4. down: `main.py down` on a; then nothing is left running on either host (b's `join` stops its node when the
     head stops answering).
Then, also after a failure, every process of both hosts is killed and the namespaces and the temp dir removed.

    sudo .venv/bin/python tests/benchmarks/two_hosts.py [--out tests/benchmarks/results/two_hosts_cpu.json]
"""

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from _common import ROOT  # noqa: E402  (also puts the repository on sys.path)
from _host_a import make_version, read_events  # noqa: E402
from _hosts import hosts, missing, remove_hosts, wire  # noqa: E402

PORT, NATS_PORT = 18431, 14333  # each host has its own ports: these only need to be free inside the namespaces
PY, MAIN, SELF = sys.executable, str(ROOT / "main.py"), str(Path(__file__).resolve())
CHAT = {"messages": [{"role": "user", "content": "Name one prime number."}], "max_tokens": 8}


def preset(path: Path, head_ip: str) -> None:
    data = yaml.safe_load((ROOT / "config" / "cpu.yaml").read_text())
    for section, values in {
        "nats": {"host": head_ip, "port": NATS_PORT},
        "ray": {"node_ip": head_ip},
        "weights": {"store": "nats"},
        "serve": {"port": PORT, "replicas": 2, "max_replicas_per_node": 1},
    }.items():
        data.setdefault(section, {}).update(values)
    path.write_text(yaml.safe_dump(data))


def wait(what: str, fn, timeout_s: float, every_s: float = 0.5):
    """fn() until it is truthy: (its value, seconds it took)."""
    t0 = time.monotonic()
    while not (v := fn()):
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(every_s)
    return v, round(time.monotonic() - t0, 1)


def running(proc: subprocess.Popen, what: str) -> bool:
    if proc.poll() is not None:
        raise RuntimeError(f"{what} exited with {proc.returncode} (see its log)")
    return True


def join_address(log: Path) -> str | None:
    """The head's Ray address from the line `up` prints once its Ray runs ("join: python main.py join ADDRESS ...")."""
    found = re.search(r"main\.py join (\S+) ", log.read_text(errors="replace")) if log.exists() else None
    return found and found.group(1)


def run_file(host) -> dict | None:
    try:
        return json.loads((host.real / "run.json").read_text())
    except (OSError, ValueError):  # not yet written, or being written
        return None


def served(host, key: str) -> str | None:
    code, body = host.http(PORT, "/v1/models", key, timeout=10)
    return body["data"][0].get("weights_version") if code == 200 and body.get("data") else None


def replica_tag(host) -> str | None:
    code, body = host.http(PORT, "/healthz", timeout=10)
    return body.get("replica") if code == 200 else None


def learner_holds(a, env: dict) -> dict | None:
    r = a.run([PY, MAIN, "status", "--json"], env, timeout=150)
    try:
        st = json.loads(r.stdout)
    except ValueError:
        return None
    learner = st.get("actors", {}).get("learner", {})
    return (
        {"held_live": learner["held_live"], "unacked": st.get("consumers", {}).get("learner", {}).get("unacked")}
        if learner.get("held_live")
        else None
    )


def sha256(path: Path) -> str:
    from policies.weights.model_store import sha256_file

    return sha256_file(path)


def checks(a, b, work: Path, cfg: Path, out: dict) -> None:
    env = {"KAIZEN_STATE_DIR": str(a.state)}
    model = ROOT / ".kaizen" / "model" / "smollm2-135m-instruct"
    if not (model / "model.safetensors").exists():
        from policies.weights.model_store import ensure_base_model

        model = ensure_base_model(work / "convert", progress=True)
    for h in (a, b):  # what an image would hold: the base model, converted once
        shutil.copytree(model, h.real / "model" / "smollm2-135m-instruct")
    t0 = time.monotonic()
    up = a.popen([PY, MAIN, "up", "--config", str(cfg)], work / "a-up.log", env)
    address, out["a_ray_s"] = wait("a's Ray head", lambda: running(up, "up") and join_address(work / "a-up.log"), 900, 1.0)
    shutil.copy2(a.real / "ray_auth_token", b.real / "ray_auth_token")  # the one secret b needs from a
    join = b.popen([PY, MAIN, "join", address, "--node-ip", b.addr, "--num-cpus", "1"], work / "b-join.log", env)
    run, out["a_up_ready_s"] = wait("a ready", lambda: running(up, "up") and running(join, "join") and run_file(a), 900, 1.0)
    key = (a.real / "api_key").read_text().strip()
    _, out["b_replica_ready_s"] = wait("b's replica ready", lambda: b.http(PORT, "/readyz", timeout=5)[0] == 200, 300)
    tag_a, tag_b = replica_tag(a), replica_tag(b)
    out["replicas"] = {"a": tag_a, "b": tag_b, "b_pids": b.processes("ray::ServeReplica")}
    assert tag_a and tag_b and tag_a != tag_b and out["replicas"]["b_pids"], f"one replica on each host: {out['replicas']}"
    out["ready_s"] = round(time.monotonic() - t0, 1)
    print(
        f"[two-hosts] a's Ray head after {out['a_ray_s']} s, b joined; a ready {out['a_up_ready_s']} s later with "
        f"replicas {tag_a} (a) and {tag_b} (b)",
        flush=True,
    )

    # 1. a promoted version reaches b's replica, through the bus only
    r = a.run([PY, SELF, "_version", str(cfg)], env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    made = json.loads(r.stdout.strip().splitlines()[-1])
    v = made["version"]
    r = a.run([PY, MAIN, "promote", v, "--force", "--reason", "two-host test"], env)
    assert r.returncode == 0, r.stderr[-2000:]
    t_promote = time.monotonic()
    _, out["promoted_b_s"] = wait(f"{v} served by b", lambda: served(b, key) == v, 300)
    out["promoted_a_s"] = round(wait(f"{v} served by a", lambda: served(a, key) == v, 300)[1] + out["promoted_b_s"], 1)
    code, chat = b.http(PORT, "/v1/chat/completions", key, CHAT)
    b_file = b.real / "weights" / f"{v}.safetensors"
    out["promoted"] = {
        "version": v,
        "b_chat_fingerprint": chat.get("system_fingerprint"),
        "b_chat_status": code,
        "b_has_own_copy": b_file.exists() and not b_file.is_symlink(),
        "b_copy_sha256_ok": b_file.exists() and sha256(b_file) == made["sha256"],
        "seconds_after_promote": round(time.monotonic() - t_promote, 1),
    }
    p = out["promoted"]
    out["pass_promoted"] = p["b_chat_fingerprint"] == v and p["b_has_own_copy"] and p["b_copy_sha256_ok"]
    print(
        f"[two-hosts] 1. promoted {v}: b serves it {out['promoted_b_s']} s after `promote` (a: {out['promoted_a_s']} s);"
        f" b's own verified copy: {p['b_copy_sha256_ok']}",
        flush=True,
    )

    # 2. feedback sent to b reaches the learner on a
    code, chat = a.http(PORT, "/v1/chat/completions", key, CHAT)
    iid = chat.get("id")
    fb_code, _ = b.http(PORT, "/v1/feedback", key, {"interaction_id": iid, "score": 1.0})
    held, out["feedback_to_learner_s"] = wait("the learner holds the rated interaction", lambda: learner_holds(a, env), 300, 2.0)
    r = a.run([PY, SELF, "_events", iid], env, timeout=120)
    seen = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else {"error": r.stderr[-500:]}
    out["feedback"] = {"interaction_id": iid, "chat_status": code, "feedback_status": fb_code, "learner": held, **seen}
    out["pass_feedback"] = (
        fb_code == 202
        and seen.get("interaction_replica") == tag_a
        and seen.get("feedback_producer") == f"serve:{tag_b}"
        and bool(seen.get("judgement"))
    )
    print(
        f"[two-hosts] 2. feedback through b ({fb_code}) on a's interaction reached the learner in "
        f"{out['feedback_to_learner_s']} s: {held}; {seen}",
        flush=True,
    )

    # 3. kill -9 of b's replica: another one on b, serving the live version (a's replica serves it)
    (victim,) = b.processes("ray::ServeReplica")
    live = served(a, key)
    polls = {"ok": 0, "failed": 0}

    def back():
        tag = replica_tag(b)
        polls["ok" if tag else "failed"] += 1
        return tag if tag not in (None, tag_a, tag_b) else None

    os.kill(victim, signal.SIGKILL)
    new_tag, out["restart_replica_s"] = wait("a new replica on b", back, 300)
    first = served(b, key)
    _, live_s = wait(f"b's new replica serving {live}", lambda: served(b, key) == live, 120)
    out["restart"] = {
        "killed_pid": victim,
        "new_tag": new_tag,
        "new_pids": b.processes("ray::ServeReplica"),
        "live": live,
        "first_version": first,
        "b_proxy_polls_during_restart": polls,
    }
    out["restart_live_s"] = round(out["restart_replica_s"] + live_s, 1)
    out["pass_restart"] = bool(out["restart"]["new_pids"]) and victim not in out["restart"]["new_pids"]
    print(
        f"[two-hosts] 3. kill -9 of b's replica (pid {victim}): {new_tag} up on b in {out['restart_replica_s']} s, "
        f"serving {live} at {out['restart_live_s']} s (first answer: {first}); b's proxy meanwhile {polls}",
        flush=True,
    )

    # 4. `down` on a stops both hosts
    t0 = time.monotonic()
    r = a.run([PY, MAIN, "down"], env, timeout=120)
    out["down_rc"], out["down_s"] = r.returncode, round(time.monotonic() - t0, 1)
    _, a_s = wait("nothing left on a", lambda: not a.pids(), 120)
    _, b_s = wait("nothing left on b", lambda: not b.pids(), 120)
    out["down_a_empty_s"] = round(out["down_s"] + a_s, 1)
    out["down_b_empty_s"] = round(out["down_s"] + a_s + b_s, 1)
    out["down_exit_codes"] = {"up": up.wait(5), "join": join.wait(5)}
    out["pass_down"] = r.returncode == 0
    print(
        f"[two-hosts] 4. down: {out['down_s']} s; a empty at {out['down_a_empty_s']} s, b empty at "
        f"{out['down_b_empty_s']} s; exit codes {out['down_exit_codes']}",
        flush=True,
    )


def main() -> int:
    if sys.argv[1:2] == ["_version"]:
        return make_version(sys.argv[2]) or 0
    if sys.argv[1:2] == ["_events"]:
        return read_events(sys.argv[2]) or 0
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", help="write the figures here (JSON)")
    p.add_argument("--logs", default="/tmp/kz2h-logs", help="copy the hosts' logs here")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a timeout's SIGTERM still tears the hosts down
    if why := missing():
        print(f"[two-hosts] skipped: {why}")
        return 2
    tag = str(os.getpid() % 100000)
    work = Path(tempfile.mkdtemp(prefix="kz2h-", dir="/tmp"))
    a, b = hosts(tag, work)
    cfg = work / "two_hosts.yaml"
    preset(cfg, a.addr)
    out: dict = {"started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": os.cpu_count()}
    t0 = time.monotonic()
    try:
        wire(tag, a, b)
        checks(a, b, work, cfg, out)
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        print(f"[two-hosts] FAILED: {out['error']}", flush=True)
    finally:
        logs = Path(args.logs)
        for h in (a, b):
            for f in [*(h.real / "logs").glob("*.log"), *work.glob(f"{h.name}-*.log")]:
                (logs / h.name).mkdir(parents=True, exist_ok=True)
                shutil.copy(f, logs / h.name / f.name)
        out["teardown_killed"] = remove_hosts(tag, (a, b))
        subprocess.run(["rm", "-rf", str(work)], check=False)
    out["wall_s"] = round(time.monotonic() - t0, 1)
    names = ("promoted", "feedback", "restart", "down")
    out["passed"] = all(out.get(f"pass_{n}") for n in names)
    print(
        "[two-hosts] "
        + "  ".join(f"{n}: {'PASS' if out.get(f'pass_{n}') else 'FAIL'}" for n in names)
        + f"  (wall {out['wall_s']} s; logs in {args.logs})"
    )
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0 if out["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
