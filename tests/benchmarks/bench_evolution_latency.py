"""Interaction -> served weights: how long until what a user said is in the weights that answer users.

Starts `main.py up --detach` on a fresh state dir (or uses a running one with `--state`), sends chat
requests with feedback through the OpenAI client (as test_e2e does) until a version trained on that
feedback serves requests, then reads the whole `evo.>` stream and follows each rated interaction
through its chain: interaction -> feedback -> judgement -> learner step -> weights version -> first
served by a replica (as canary, then as live). Prints the distribution over the interactions a served
version learned from, and each stage for the freshest one.

    .venv/bin/python tests/benchmarks/bench_evolution_latency.py [--budget-s 1500] [--out FILE]
"""

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from _common import ROOT  # noqa: E402  (also puts the repository on sys.path)

QA = [
    ("What is the capital of France?", "paris"),
    ("What is 2 + 2?", "4"),
    ("Name the largest planet in the solar system.", "jupiter"),
    ("What color is a clear daytime sky?", "blue"),
]


def ts(ev: dict) -> float:
    return datetime.fromisoformat(ev["occurred_at"]).timestamp()


async def read_stream(state: Path) -> list[dict]:
    from nats.js import api

    from actors.bus import Bus

    run = json.loads((state / "run.json").read_text())
    bus = await Bus(run["nats_url"], run["nats_user"], (state / "nats.password").read_text().strip(), producer="bench").connect(
        ensure_stream=False
    )
    sub = await bus.js.subscribe("evo.>", ordered_consumer=True, config=api.ConsumerConfig(deliver_policy=api.DeliverPolicy.ALL))
    out = []
    while True:
        try:
            out.append(json.loads((await sub.next_msg(timeout=3.0)).data))
        except (TimeoutError, asyncio.TimeoutError):
            break
    await bus.close()
    return out


def chains(events: list[dict]) -> dict:
    """For the first version trained on live feedback that a replica served: the latency of each
    interaction it learned from, and the stages of the freshest one."""
    by_kind: dict[str, list[dict]] = {}
    for e in events:
        by_kind.setdefault(e["kind"], []).append(e)
    interaction = {e["interaction_id"]: e for e in by_kind.get("interaction", [])}
    feedback = {e["event_id"]: e for e in by_kind.get("feedback", [])}
    judged = {}  # judgement id -> (judgement, feedback)
    for j in by_kind.get("judgement", []):
        if j.get("source") == "live":
            fb = next((feedback[i] for i in j.get("source_event_ids", []) if i in feedback), None)
            if fb:
                judged[j["event_id"]] = (j, fb)
    version_of_step, parents = {}, {}
    for s in by_kind.get("learner_step", []):
        version_of_step[s["weights_version"]] = s
    for p in by_kind.get("weights_published", []):
        parents[p["weights"]["version"]] = p["weights"].get("parent", "")
    served = {}  # version -> (first time served as canary or live, role)
    for e in by_kind.get("weights_swapped", []):
        for v, role in ((e["version"], "live"), (e.get("canary"), "canary")):
            if v and v != "w-000000" and (v, role) not in served:
                served[(v, role)] = ts(e)
    for (version, role), t_served in sorted(served.items(), key=lambda kv: kv[1]):
        lineage, v = [], version
        while v in version_of_step and v not in lineage:
            lineage.append(v)
            v = parents.get(v, "")
        rows = []
        for v in lineage:
            step = version_of_step[v]
            for jid in step.get("source_event_ids", []):
                if jid in judged:
                    j, fb = judged[jid]
                    it = interaction.get(fb["interaction_id"])
                    if it:
                        rows.append(
                            {
                                "interaction": ts(it),
                                "feedback": ts(fb),
                                "judgement": ts(j),
                                "learner_step": ts(step),
                                "version": v,
                            }
                        )
        if not rows:
            continue
        stage = {
            k: next(
                (
                    ts(e)
                    for e in by_kind.get(k, [])
                    if e.get("weights", {}).get("version") == version or e.get("version") == version
                ),
                None,
            )
            for k in ("weights_published", "weights_promoted")
        }
        live_at = served.get((version, "live"))
        fresh = max(rows, key=lambda r: r["interaction"])
        return {
            "version": version,
            "first_served_as": role,
            "served_at": t_served,
            "live_at": live_at,
            "interactions": len(rows),
            "latency_s": sorted(round(t_served - r["interaction"], 1) for r in rows),
            "to_live_s": sorted(round(live_at - r["interaction"], 1) for r in rows) if live_at else None,
            "freshest": {
                k: round(v - fresh["interaction"], 1)
                for k, v in {
                    **{k: fresh[k] for k in ("feedback", "judgement", "learner_step")},
                    **{k: v for k, v in stage.items() if v},
                    "served": t_served,
                    **({"live": live_at} if live_at else {}),
                }.items()
            },
        }
    return {}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--state", help="state dir of a running `up` (default: start one)")
    ap.add_argument("--budget-s", type=float, default=1500)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    import httpx
    import openai

    from deploy.nats import free_port

    started = None
    state = Path(a.state) if a.state else Path(tempfile.mkdtemp(prefix="kz-latency-")) / "state"
    if not a.state:
        if Path(".kaizen/model").exists():  # reuse the one-time conversion
            import shutil

            shutil.copytree(".kaizen/model", state / "model")
        env = {**os.environ, "KAIZEN_STATE_DIR": str(state), "KAIZEN_SERVE_PORT": str(free_port())}
        started = subprocess.run(
            [sys.executable, str(ROOT / "main.py"), "up", "--detach"],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=1200,
        )
        assert started.returncode == 0, started.stdout + started.stderr
    run = json.loads((state / "run.json").read_text())
    key = Path(run["api_key_file"]).read_text().strip()
    c = openai.OpenAI(base_url=run["endpoint"], api_key=key, max_retries=0, timeout=300)
    t0, sent, failed, first, i = time.monotonic(), 0, 0, None, 0
    try:
        while time.monotonic() - t0 < a.budget_s:
            q, ans = QA[i % len(QA)]
            i += 1
            try:
                r = c.chat.completions.create(model=run["model"], messages=[{"role": "user", "content": q}], max_tokens=20)
            except openai.APIError:
                failed += 1
                continue
            sent += 1
            first = first or r.system_fingerprint
            score = 1.0 if ans in (r.choices[0].message.content or "").lower() else -1.0
            httpx.post(
                run["endpoint"] + "/feedback",
                headers={"Authorization": f"Bearer {key}"},
                json={"interaction_id": r.id, "score": score},
                timeout=60,
            )
            if r.system_fingerprint != first and i % 10 == 0:
                res = chains(asyncio.run(read_stream(state)))
                if res.get("live_at"):
                    break
        res = chains(asyncio.run(read_stream(state)))
    finally:
        if started is not None:
            subprocess.run(
                [sys.executable, str(ROOT / "main.py"), "down"],
                env={**os.environ, "KAIZEN_STATE_DIR": str(state)},
                cwd=ROOT,
                capture_output=True,
                timeout=300,
            )
    res.update(requests=sent, failed=failed, traffic_s=round(time.monotonic() - t0))
    if not res.get("latency_s"):
        print(f"no trained version was served within {a.budget_s:.0f}s ({sent} requests, {failed} failed)")
    else:
        lat = res["latency_s"]
        print(
            f"{res['version']} first served as {res['first_served_as']}; learned from {res['interactions']} rated "
            f"interactions; interaction -> served p50 {statistics.median(lat):.0f}s (min {lat[0]:.0f}s, max {lat[-1]:.0f}s)"
        )
        if res.get("to_live_s"):
            print(f"interaction -> served to every request (live) p50 {statistics.median(res['to_live_s']):.0f}s")
        print("freshest interaction, seconds after it:", json.dumps(res["freshest"]))
        print(f"{sent} requests, {failed} failed, {res['traffic_s']}s of traffic")
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
