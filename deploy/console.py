"""`status` (served version, actor health and backlog, stream size, newest held-out delta) and `promote`
(an operator's forced publish).
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from pathlib import Path

from config.settings import Settings
from deploy.launch import pid_alive, say
from deploy.reports import heldout_cache
from deploy.stream_view import connect

STATUS_BUDGET_S = 45.0  # every part is asked at once; one that has not answered by then is reported as such


def status(s: Settings, run: dict, args) -> int:
    out: dict = {"endpoint": run["endpoint"], "pid": run["pid"], "up": pid_alive(run["pid"])}
    parts = {
        "served": lambda: _served_version(s, run),
        "bus": lambda: asyncio.run(asyncio.wait_for(_bus_status(s, run), 30.0)),
        "heldout": lambda: _heldout_delta(s),
    }
    if not args.no_actors:
        parts["actors"] = lambda: _actor_health(run, s.state)
    got, took = _gather(parts, STATUS_BUDGET_S)
    out["served_weights_version"] = got["served"] if isinstance(got["served"], str) else f"unreachable: {got['served']!r}"[:120]
    if isinstance(got["bus"], dict):
        out.update(got["bus"])
        out["bus"] = "connected"
    else:  # status answers, and says so, while nats-server is down
        out.update({"bus": f"down: {got['bus']!r}"[:200], "stream": {}, "consumers": {}, "last": {}})
    if "actors" in got:
        out["actors"] = got["actors"] if isinstance(got["actors"], dict) else {"error": repr(got["actors"])[:200]}
    out["heldout"] = got["heldout"] if isinstance(got["heldout"], dict) else {"error": repr(got["heldout"])[:200]}
    out["took_s"] = took
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
    print("actor           backlog  unacked  health")
    for name in ("questioner", "explorer", "explorer-first", "attributor", "navigator", "learner", "broadcaster"):
        c = out["consumers"].get(name, {})
        h = out.get("actors", {}).get(name) or (
            {"reads": "live steps and weights ahead of tasks"} if name.endswith("-first") else {}
        )
        print(f"{name:<15} {c.get('pending', '-'):>7}  {c.get('unacked', '-'):>7}  {json.dumps(h)[:160]}")
    b = out.get("actors", {}).get("broadcaster", {})
    if b.get("replicas") is not None:
        print(f"canary          {json.dumps(b.get('canary'))}; next {b.get('passed') or '-'}; live history {b.get('history')}")
        gd = b.get("guard") or {}
        print(
            f"vs base         checked {json.dumps(b.get('checked'))}; rollback anchor {b.get('no_worse_than_base') or '-'}"
            + (f"; checking {gd['checking']} ({gd['checked_entries']} entries)" if gd.get("checking") else "")
            + (f"; base {json.dumps(gd['base'])}" if gd.get("base") else "")
            + (f"; {gd['error']}" if gd.get("error") else "")
        )
        for name, r in sorted(b["replicas"].items()):
            print(
                f"replica         {name}: serves {r['version']}"
                + (f" + canary {r['canary']}" if r.get("canary") else "")
                + f" (last change: {r.get('reason')}, {r.get('swap_ms')} ms)"
            )
    a, q = out.get("actors", {}).get("attributor", {}), out.get("actors", {}).get("questioner", {})
    if a.get("judge_agreement"):
        g = a["judge_agreement"]
        print(
            f"judge           {a.get('judge')}: agreement with environment {g['accuracy']} (kappa {g['kappa']}) over "
            f"{g['steps']} steps; {json.dumps(a.get('judge_stats', {}))}"
        )
    if q.get("synthetic") is not None:
        print(f"synthetic tasks {json.dumps(q['synthetic'])}; issued {json.dumps(q.get('mix'))}")
    if q.get("ladder"):
        print(f"ladder          {json.dumps(q['ladder'])}")
    ln = out.get("actors", {}).get("learner", {})
    if ln.get("rollout_groups"):
        print(
            f"signal          {ln['informative_own_share']:.0%} of {int(ln['rollout_groups'])} rollout groups informative "
            f"on their own, {ln['informative_share']:.0%} with references"
        )
    h = out["heldout"]
    if h.get("version"):
        print(
            f"held-out        {h['version']} vs base: "
            + "; ".join(
                f"{env} {100 * d['avg']:.1f}% ({100 * d['delta']:+.1f} points, p={d['p_value']:.3f})"
                for env, d in h["envs"].items()
            )
        )
    else:
        print("held-out        no version scored yet (main.py report --eval)")
    return 0


class NoAnswer(Exception):
    """A status part that had not answered within the budget."""


def _gather(parts: dict, budget_s: float) -> tuple[dict, dict]:
    """Runs every part in its own daemon thread and waits at most `budget_s` in all. A part's value is what
    it returned, the exception it raised, or NoAnswer; `took` says how long each one took (None: no answer)."""
    got: dict = {}
    took: dict = {}

    def one(name, fn):
        t0 = time.monotonic()
        try:
            got[name] = fn()
        except Exception as exc:
            got[name] = exc
        took[name] = round(time.monotonic() - t0, 2)

    threads = [threading.Thread(target=one, args=item, daemon=True, name=f"status-{item[0]}") for item in parts.items()]
    for th in threads:
        th.start()
    deadline = time.monotonic() + budget_s
    for th in threads:
        th.join(max(0.0, deadline - time.monotonic()))
    return ({n: got.get(n, NoAnswer(f"no answer within {budget_s:.0f} s")) for n in parts}, {n: took.get(n) for n in parts})


def _served_version(s: Settings, run: dict) -> str:
    import httpx

    key = Path(run["api_key_file"]).read_text().strip() if run.get("api_key_file") else s.serve.api_key
    r = httpx.get(run["endpoint"] + "/models", headers={"Authorization": f"Bearer {key}"}, timeout=5)
    return r.json()["data"][0]["weights_version"]


def _heldout_delta(s: Settings) -> dict:
    """The newest version scored on the held-out suite against the base (paired), from the report's cache."""
    from envs.registry import make_envs
    from policies.weights.model_store import BASE_VERSION, version_number

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

    bus = await asyncio.wait_for(connect(s, run), 10.0)  # refused at once when down; a loaded one gets time
    try:
        info = await bus.stream_info()
        consumers = {}
        for name in ("questioner", "explorer", "explorer-first", "attributor", "navigator", "learner", "broadcaster"):
            try:
                ci = await bus.consumer_info(name)
                consumers[name] = {"pending": ci.num_pending, "unacked": ci.num_ack_pending, "redelivered": ci.num_redelivered}
            except Exception:
                consumers[name] = {}
        last = {}
        for kind in ("weights_promoted", "weights_rejected", "weights_rolled_back"):
            try:
                m = await bus.js.get_last_msg(s.nats.stream, subject_for(kind, s.nats.subject_prefix))
                ev = json.loads(m.data)
                version = ev["weights"]["version"] if "weights" in ev else ev.get("to", {}).get("version")
                last[kind] = f"{version} at {ev['occurred_at']}"
            except Exception:
                last[kind] = None
        return {"stream": {"messages": info.state.messages, "bytes": info.state.bytes}, "consumers": consumers, "last": last}
    finally:
        await bus.close()


def _actor_health(run: dict, state: Path) -> dict:
    import ray

    from deploy import ray_local

    out = {}
    try:
        ray.init(address=run["gcs_address"], namespace=ray_local.NAMESPACE, log_to_driver=False, logging_level="ERROR")
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


def promote(s: Settings, run: dict, args) -> int:
    """Operator override: publish a stored version with force=True; the broadcaster makes it live at once,
    skipping the gate and the canary. Live monitoring still applies: if users' feedback on it drops
    against the version it replaced, it is rolled back automatically."""
    from actors.events import WeightsPublished, WeightsRef
    from policies.weights.model_store import WeightsStore

    if not args.force:
        sys.exit("promote skips the gate and the canary: add --force to confirm")
    man = WeightsStore(s.state).manifest(args.version)
    if man is None:
        sys.exit(f"unknown weights version {args.version!r} (see {WeightsStore(s.state).dir})")
    ev = WeightsPublished(
        weights=WeightsRef(
            version=args.version,
            path=man["path"],
            sha256=man["sha256"],
            parent=man.get("parent", ""),
            step=int(man.get("step", 0)),
        ),
        force=True,
        reason=args.reason or "main.py promote --force",
    )

    async def send():
        bus = await connect(s, run)
        try:
            await bus.publish(ev, weights_version=args.version)
        finally:
            await bus.close()

    asyncio.run(send())
    say(f"published {args.version} with force=True (event {ev.event_id}); watch: python main.py events weights_status")
    return 0
