"""kill -9 of the learner in the middle of a step and in the middle of writing a checkpoint (real nats-server,
real SmolLM2, the learner in its own process): after restarts every judgement is trained on exactly once,
versions follow each other, and the last checkpoint verifies."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from sample_groups import two_sample_group  # tests/ is on sys.path

from actors.bus import Bus
from actors.events import parse_event

ROOT = Path(__file__).resolve().parents[2]
N_GROUPS = 8  # 4 steps of 2 groups


async def _events(bus, prefix, kind):
    from nats.js import api

    sub = await bus.js.subscribe(
        f"{prefix}.{kind}", ordered_consumer=True, config=api.ConsumerConfig(deliver_policy=api.DeliverPolicy.ALL)
    )
    out = []
    while True:
        try:
            out.append(parse_event((await sub.next_msg(timeout=2.0)).data))
        except (TimeoutError, asyncio.TimeoutError):
            break
    await sub.unsubscribe()
    return out


async def test_kill_9_mid_step_and_mid_checkpoint(settings, nats_server, model_dir):
    p = "l" + uuid.uuid4().hex[:8]
    settings.nats.stream, settings.nats.subject_prefix = p.upper(), p
    settings.nats.ack_wait_s = 20.0  # redelivery of what the killed process held
    settings.model.source, settings.model.path = "hf-folder", str(model_dir)
    settings.learner.groups_per_step = 2
    settings.state.mkdir(parents=True, exist_ok=True)
    (settings.state / "settings.json").write_text(settings.model_dump_json())
    log = settings.state / "learner.log"
    script = (
        "import asyncio, sys; sys.path.insert(0, %r)\n"
        "from config import telemetry\nfrom config.settings import Settings\nfrom actors.learner import Learner\n"
        "s = Settings.model_validate_json(open(%r).read())\n"
        "telemetry.setup('learner', 'info', None, stream=open(%r, 'a', buffering=1))\n"
        "asyncio.run(Learner(s).run())\n" % (str(ROOT), str(settings.state / "settings.json"), str(log))
    )
    env = {**os.environ, "KAIZEN_STRICT_EVENTS": "1", "OMP_NUM_THREADS": "1"}
    bus = await Bus(nats_server.url, nats_server.user, nats_server.password, stream=p.upper(), prefix=p).connect()
    ckpt_dir = settings.state / "learner"

    def manifest_step():
        try:
            return json.loads((ckpt_dir / "checkpoint.json").read_text())["step"]
        except (OSError, ValueError):
            return 0

    def start():
        return subprocess.Popen(
            [sys.executable, "-c", script],
            env=env,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=open(settings.state / "learner.err", "a"),
        )

    async def wait_for(pred, timeout, what):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred():
                return
            await asyncio.sleep(0.05)
        pytest.fail(
            f"timed out waiting for {what}; log: {log.read_text()[-2000:] if log.exists() else ''}"
            f"{(settings.state / 'learner.err').read_text()[-2000:]}"
        )

    for i in range(N_GROUPS):
        await bus.publish(two_sample_group(i))
    proc = start()
    try:
        # 1) killed in the middle of a step: after step_started, before its checkpoint
        await wait_for(lambda: log.exists() and "learner.step_started" in log.read_text(), 300, "a step to start")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        assert manifest_step() == 0, "the step was committed before the kill"
        # 2) killed while a checkpoint file is being written, after one was committed (so there is one to resume)
        proc = start()
        await wait_for(
            lambda: manifest_step() >= 1 and any(ckpt_dir.glob(".ckpt-*.tmp")), 300, "a second checkpoint to be written"
        )
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        killed_at = manifest_step()
        # 3) a clean run to the end
        proc = start()

        async def drained():
            try:
                info = await bus.consumer_info("learner")
                return info.num_pending == 0 and info.num_ack_pending == 0
            except Exception:
                return False

        deadline = time.monotonic() + 600
        while not (await drained() and manifest_step() == N_GROUPS // 2):
            assert time.monotonic() < deadline, f"did not finish; checkpoint step {manifest_step()}"
            assert proc.poll() is None, (settings.state / "learner.err").read_text()[-3000:]
            await asyncio.sleep(1.0)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(60)
    steps = {e.step: e for e in await _events(bus, p, "learner_step")}
    published = {e.weights.version: e for e in await _events(bus, p, "weights_published")}
    await bus.close()
    assert sorted(steps) == [1, 2, 3, 4] and 1 <= killed_at < 4
    applied = sorted(i for e in steps.values() for i in e.source_event_ids)
    assert applied == [f"j-{i}" for i in range(N_GROUPS)]  # each judgement in exactly one step
    from policies.learning.checkpoint import CheckpointStore
    from policies.weights.model_store import WeightsStore

    store = WeightsStore(settings.state)
    versions = sorted(published)
    assert [store.manifest(v)["step"] for v in versions] == [1, 2, 3, 4]
    assert [store.manifest(v)["parent"] for v in versions] == ["w-000000", *versions[:-1]]  # one lineage
    assert all(store.verify(e.weights.path, e.weights.sha256) for e in published.values())
    state, man, skipped = CheckpointStore(settings.state / "learner").load()
    assert man["step"] == 4 and man["version"] == versions[-1] and skipped == []
    assert sorted(state["applied"]) == [f"j-{i}" for i in range(N_GROUPS)]
    assert "learner.resumed" in log.read_text()
