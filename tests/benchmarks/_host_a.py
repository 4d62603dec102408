"""What tests/benchmarks/two_hosts.py runs on host a as a subprocess of itself, inside a's namespaces and with its
state dir: `two_hosts.py _version CONFIG` saves a new weights version as the learner saves it, `two_hosts.py _events
ID` prints who took an interaction and its feedback, and the judgement of it."""

import argparse
import json
import os


def make_version(cfg: str) -> None:
    """On host a: a new weights version saved as the learner saves it (file, object store, manifest); prints it."""
    import asyncio

    import torch
    from safetensors.torch import load_file

    from actors.bus import Bus
    from config.hardware import resolve_dtype
    from config.settings import load_settings
    from policies.engines.live_policy import LivePolicy
    from policies.weights.model_store import BASE_VERSION, base_weights, version_name

    s = load_settings(cfg)
    s.state_dir = os.environ["KAIZEN_STATE_DIR"]
    s.nats.url, s.nats.password = f"nats://{s.nats.host}:{s.nats.port}", (s.state / "nats.password").read_text().strip()

    async def go():
        bus = await Bus.from_settings(s.nats, "two-hosts").connect(ensure_stream=False, attempts=3)
        policy = LivePolicy(s)
        await policy.attach(bus.js, follow=False)  # the object store: `save` uploads into it
        dtype = getattr(torch, resolve_dtype(s.model.serve_dtype, "cpu"))
        sd = {k: v.to(dtype) for k, v in load_file(str(base_weights(policy.base))).items()}
        sd["model.norm.weight"] = sd["model.norm.weight"] * 1.01
        version = version_name(policy.store.latest_number() + 1)
        path, sha = await asyncio.to_thread(policy.store.save, sd, version, {"parent": BASE_VERSION, "step": 0})
        await bus.close()
        print(json.dumps({"version": version, "sha256": sha, "path": str(path)}))

    asyncio.run(go())


def read_events(iid: str) -> None:
    """On host a: who took the interaction and the feedback, and the judgement of it."""
    import asyncio

    from deploy.launch import read_run
    from deploy.stream_view import read_events as stored
    from main import settings_from

    s = settings_from(argparse.Namespace(config=None))
    evs = [
        e
        for e in asyncio.run(stored(s, read_run(s), ["interaction", "feedback", "judgement"]))
        if getattr(e, "interaction_id", None) == iid or getattr(e, "group_id", "") == f"live:{iid}"
    ]
    it = next((e for e in evs if e.kind == "interaction"), None)
    fb = next((e for e in evs if e.kind == "feedback"), None)
    j = next((e for e in evs if e.kind == "judgement"), None)
    print(
        json.dumps(
            {"interaction_replica": it and it.replica, "feedback_producer": fb and fb.producer, "judgement": j and j.group_id}
        )
    )
