"""Fast-loop scenario against a running system (`python main.py up --detach` first).

One kind of request ("create a folder named X", with the BFCL file-system tools) is sent to the
live agent. Phase 1: each answer is checked (a `mkdir` call with `dir_name` = X) and rated through
`POST /v1/feedback`; failures carry the user's correction as the comment. The attributor judges
each rated interaction and the navigator turns it into an experience within seconds. Phase 2:
new folder names, each asked with memory on and with memory off (`extra_body={"memory": false}`),
with `tool_choice` as a tool-using client sends it (default "required"),
interleaved, so both conditions see the same weights and load. Prints the success rates side by
side, how often experiences were in the context, and feedback -> experience latency.

    .venv/bin/python tests/benchmarks/bench_fast_loop.py [--names 10] [--repeats 2] [--state .kaizen]
"""

import argparse
import asyncio
import json
import statistics
import threading
import time
from pathlib import Path

import httpx  # noqa: E402
import openai  # noqa: E402

from _common import ROOT  # noqa: F401  (puts the repository on sys.path)
from config.settings import load_settings  # noqa: E402
from envs.bfcl import func_docs, to_tool_spec  # noqa: E402

KIND = "Create a new folder named {name} in the current directory."
CORRECTION = "Call mkdir with dir_name set to the folder name I asked for."
PHASE1 = [
    "alpha",
    "reports",
    "photos",
    "archive",
    "drafts",
    "music",
    "backup",
    "invoices",
    "notes",
    "scripts",
    "videos",
    "slides",
]
PHASE2 = [
    "budget",
    "travel",
    "recipes",
    "letters",
    "designs",
    "contracts",
    "games",
    "lectures",
    "receipts",
    "logs",
    "maps",
    "poems",
]


class ExperienceWatch:
    """Timestamps of `evo.experience` events (background thread with its own NATS connection)."""

    def __init__(self, state: Path):
        self.times: list[float] = []
        self.state = state
        threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True).start()

    async def _run(self):
        from deploy.launch import read_run
        from deploy.stream_view import connect

        s = load_settings(None, state_dir=str(self.state))
        bus = await connect(s, read_run(s))
        sub = await bus.nc.subscribe(f"{s.nats.subject_prefix}.experience")
        while True:
            try:
                await sub.next_msg(timeout=1.0)
                self.times.append(time.monotonic())
            except Exception:
                continue


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--names", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--state", default=".kaizen")
    ap.add_argument("--tool-choice", default="required", help="auto | required (what a tool-using client sends)")
    a = ap.parse_args()
    state = Path(a.state).resolve()
    run = json.loads((state / "run.json").read_text())
    key = Path(run["api_key_file"]).read_text().strip()
    client = openai.OpenAI(base_url=run["endpoint"], api_key=key, max_retries=0, timeout=300)
    tools = [
        to_tool_spec(d).model_dump() for d in func_docs("GorillaFileSystem") if d["name"] in ("mkdir", "ls", "cd", "touch", "pwd")
    ]
    watch = ExperienceWatch(state)
    time.sleep(1.0)

    def ask(name, memory):
        t = time.perf_counter()
        r = client.chat.completions.create(
            model=run["model"],
            messages=[{"role": "user", "content": KIND.format(name=name)}],
            tools=tools,
            temperature=0.7,
            max_tokens=48,
            tool_choice=a.tool_choice,
            extra_body={"memory": memory},
        )
        calls = r.choices[0].message.tool_calls or []
        ok = any(c.function.name == "mkdir" and _args(c.function.arguments).get("dir_name") == name for c in calls)
        return r, ok, time.perf_counter() - t

    def feedback(r, ok):
        httpx.post(
            run["endpoint"] + "/feedback",
            headers={"Authorization": f"Bearer {key}"},
            timeout=60,
            json={"interaction_id": r.id, "score": 1.0 if ok else -1.0, **({} if ok else {"comment": CORRECTION})},
        ).raise_for_status()
        return time.monotonic()

    phase1, lat, versions = [], [], set()
    for name in PHASE1[: a.names]:
        r, ok, _ = ask(name, True)
        versions.add(r.system_fingerprint)
        sent = feedback(r, ok)
        phase1.append(ok)
        n_before = len(watch.times)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(watch.times) == n_before:
            time.sleep(0.1)
        if len(watch.times) > n_before:
            lat.append(watch.times[n_before] - sent)
    on, off, used = [], [], 0
    for name in PHASE2[: a.names]:
        for _ in range(a.repeats):
            r, ok, _ = ask(name, True)
            versions.add(r.system_fingerprint)
            on.append(ok)
            r2, ok2, _ = ask(name, False)
            off.append(ok2)
            used += _experiences_used(state, r.id)
    rate = lambda xs: sum(xs) / max(1, len(xs))  # noqa: E731
    print(f"phase 1 (memory cold for this kind): {sum(phase1)}/{len(phase1)} succeeded = {rate(phase1):.2f}")
    if lat:
        print(
            f"feedback -> experience on the stream: p50 {statistics.median(lat):.2f} s, max {max(lat):.2f} s "
            f"({len(lat)} of {len(phase1)} rated requests produced one within 60 s)"
        )
    print(
        f"phase 2 similar requests, memory on : {sum(on)}/{len(on)} = {rate(on):.2f} "
        f"(experiences in context for {used}/{len(on)})"
    )
    print(f"phase 2 similar requests, memory off: {sum(off)}/{len(off)} = {rate(off):.2f}")
    print(f"weights versions served during the run: {sorted(versions)}")
    print(
        json.dumps(
            {
                "phase1": rate(phase1),
                "memory_on": rate(on),
                "memory_off": rate(off),
                "n_phase2": len(on),
                "experiences_in_context": used,
                "feedback_to_experience_s": lat,
                "versions": sorted(versions),
            }
        )
    )


def _args(text):
    try:
        v = json.loads(text or "{}")
        return v if isinstance(v, dict) else {}
    except ValueError:
        return {}


def _experiences_used(state: Path, interaction_id: str) -> int:
    """Whether the recorded interaction had experiences in its context (read from the stream by id, as feedback is;
    the replica's outbox publishes it within moments of the answer)."""
    from deploy.launch import read_run
    from deploy.stream_view import connect

    async def look() -> int:
        s = load_settings(None, state_dir=str(state))
        bus = await connect(s, read_run(s))
        try:
            for _ in range(50):
                it = await bus.interaction(interaction_id)
                if it is not None:
                    return int(bool(it.experience_ids))
                await asyncio.sleep(0.2)
            return 0
        finally:
            await bus.close()

    return asyncio.run(look())


if __name__ == "__main__":
    main()
