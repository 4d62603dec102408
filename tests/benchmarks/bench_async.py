"""Asynchronous vs synchronous evolution loop on the same hardware, side by side in one run.

Two processes, one torch thread each, the code the system runs: a rollout worker (the explorer's
`run_group` on BFCL train tasks with the newest weights, scored like the attributor) and a learner
(`Trainer.train_step` with the staleness bound and importance weights, then the weights file and
the pointer the rollout worker follows). Every group is trained on, so both modes do the same work.
- sync: the rollout worker generates one step's groups, then waits until the learner has trained on
  them and published the new version (strictly on-policy; the other process idles in turn);
- async: the rollout worker never waits; the learner trains on whatever arrived, dropping groups
  more than `learner.max_staleness` versions behind and correcting the rest.
Throughput = samples trained per minute over the same number of learner steps.

    .venv/bin/python tests/benchmarks/bench_async.py [--steps 6] [--groups-per-step 2] [--group-size 4]
"""

import argparse
import json
import multiprocessing as mp
import queue
import tempfile
import time
from pathlib import Path

from _common import ROOT  # noqa: E402  (also puts the repository on sys.path)


def _settings(state: str, a):
    import sys

    sys.path.insert(0, str(ROOT))
    from config.settings import load_settings

    s = load_settings(None)
    s.state_dir = state
    s.learner.groups_per_step = a.groups_per_step
    s.rollout.group_size = a.group_size
    s.model.source, s.model.path = "hf-folder", a.base
    return s


def _pointer(state: str) -> dict:
    try:
        return json.loads((Path(state) / "latest.json").read_text())
    except (OSError, ValueError):
        return {"version": "w-000000", "path": None, "step": 0}


def rollout_worker(state, a, mode, out: mp.Queue, stop: mp.Event):
    import sys

    sys.path.insert(0, str(ROOT))
    import random

    from actors.events import Judgement
    from envs.bfcl import BfclEnvironment
    from policies.engines.engine import TransformersEngine
    from policies.judge.stats import score_rollout
    from policies.rollout import run_group

    s = _settings(state, a)
    env = BfclEnvironment.from_settings(s.env)
    entries = env.entries("train")
    random.Random(0).shuffle(entries)
    eng = TransformersEngine(a.base, dtype="bfloat16", threads=1)
    made = 0
    while not stop.is_set():
        if mode == "sync" and made and made % a.groups_per_step == 0:  # wait for the step that uses this batch
            while not stop.is_set() and _pointer(state)["step"] < made // a.groups_per_step:
                time.sleep(0.05)
        p = _pointer(state)
        if p["path"] and p["version"] != eng.version:
            eng.load_weights(p["path"], p["version"])
        entry = entries[made % len(entries)]
        res = run_group(
            eng, env, entry, a.group_size, max_new_tokens=s.rollout.max_new_tokens, temperature=0.9, top_p=0.95, call_prefix=True
        )
        scored = [score_rollout(x) for x in res.samples]
        j = Judgement(
            group_id=f"g{made}",
            source="rollout",
            task_id=entry,
            samples=res.samples,
            outcomes=[o for o, _ in scored],
            step_labels=[lab for _, lab in scored],
            weights_version=eng.version,
        )
        out.put((j.model_dump_json(), res.duration_s))
        made += 1


def learner_worker(state, a, steps: int, inq: mp.Queue, stop: mp.Event, result: mp.Queue):
    import sys

    sys.path.insert(0, str(ROOT))
    import torch

    from actors.events import Judgement
    from policies.learning.staleness import staleness
    from policies.learning.trainer import Trainer
    from policies.weights.model_store import WeightsStore, version_name

    torch.manual_seed(0)
    s = _settings(state, a)
    store = WeightsStore(s.state)
    t = Trainer(s, a.base, store)
    ready, trained, dropped, ages, train_s, t0 = [], 0, 0, [], 0.0, None
    while t.step < steps:
        try:
            js, _ = inq.get(timeout=1.0)
        except queue.Empty:
            continue
        t0 = t0 or time.monotonic()
        ready.append(Judgement.model_validate_json(js))
        if len(ready) < a.groups_per_step:
            continue
        fresh = []
        for g in ready:
            age = staleness(store, t.version, g.weights_version, s.learner.max_staleness)
            if age is None:
                dropped += 1
            else:
                fresh.append(g)
                ages.append(age)
        ready = fresh
        if len(ready) < a.groups_per_step:
            continue
        groups, ready = ready[: a.groups_per_step], ready[a.groups_per_step :]
        ts = time.monotonic()
        t.train_step(groups, [[g.weights_version] * len(g.samples) for g in groups])
        version = version_name(t.step)
        path, _ = store.save(t.export("bfloat16"), version, {"parent": t.version, "step": t.step})
        t.version = version
        train_s += time.monotonic() - ts
        (Path(state) / "latest.json.tmp").write_text(json.dumps({"version": version, "path": str(path), "step": t.step}))
        (Path(state) / "latest.json.tmp").replace(Path(state) / "latest.json")
        trained += sum(len(g.samples) for g in groups)
    stop.set()
    result.put(
        {
            "wall_s": time.monotonic() - t0,
            "train_s": train_s,
            "samples": trained,
            "dropped_groups": dropped,
            "staleness_max": max(ages, default=0),
            "staleness_mean": sum(ages) / max(1, len(ages)),
        }
    )


def run(mode: str, a) -> dict:
    ctx = mp.get_context("spawn")
    state = tempfile.mkdtemp(prefix=f"kz-async-{mode}-")
    q, stop, result = ctx.Queue(), ctx.Event(), ctx.Queue()
    roll = ctx.Process(target=rollout_worker, args=(state, a, mode, q, stop))
    learn = ctx.Process(target=learner_worker, args=(state, a, a.steps, q, stop, result))
    roll.start()
    learn.start()
    res = result.get()
    learn.join(60)
    roll.join(300)
    res["samples_per_min"] = 60 * res["samples"] / res["wall_s"]
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--groups-per-step", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    import sys

    sys.path.insert(0, str(ROOT))
    from policies.weights.model_store import ensure_base_model

    a.base = str(ensure_base_model(Path(".kaizen") if Path(".kaizen/model").exists() else Path(tempfile.mkdtemp())))
    rows = []
    for rep in range(a.reps):
        for mode in ("sync", "async"):
            r = run(mode, a)
            rows.append({"mode": mode, "rep": rep, **r})
            print(
                f"{mode:5} rep {rep}: {r['samples']} samples in {r['wall_s']:.0f}s -> {r['samples_per_min']:.1f} samples/min "
                f"(training {r['train_s']:.0f}s; staleness max {r['staleness_max']}, mean {r['staleness_mean']:.2f}; "
                f"dropped groups {r['dropped_groups']})",
                flush=True,
            )
    spm = {m: sum(r["samples_per_min"] for r in rows if r["mode"] == m) / a.reps for m in ("sync", "async")}
    print(
        f"async / sync throughput = {spm['async'] / spm['sync']:.2f}x "
        f"({spm['async']:.1f} vs {spm['sync']:.1f} samples/min, {a.steps} learner steps each, 2 processes x 1 thread)"
    )
    if a.out:
        Path(a.out).write_text(json.dumps({"rows": rows, "ratio": spm["async"] / spm["sync"]}, indent=1))


if __name__ == "__main__":
    main()
