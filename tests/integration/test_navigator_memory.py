"""Navigator memory on a real nats-server, Milvus Lite and embedder: provenance, near-duplicate merge,
per-user caps, utility retirement, replay after loss of the database, and kill -9 in the middle of writes."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from actors.bus import Bus
from actors.events import ChatMessage, Judgement, Sample, ToolCall, parse_event

ROOT = Path(__file__).resolve().parents[2]


def _judgement(query, ok=True, user=None, jid=None, guided=False, exp_ids=()):
    call = ChatMessage(role="assistant", tool_calls=[ToolCall(id="c", name="mkdir", arguments='{"dir_name": "x"}')])
    s = Sample(
        sample_id="s",
        messages=[ChatMessage(role="system", content="s"), ChatMessage(role="user", content=query), call],
        step_indices=[2],
        guided=guided,
        experience_ids=list(exp_ids),
    )
    return Judgement(
        event_id=jid or str(uuid.uuid4()),
        group_id="g",
        source="live" if user else "rollout",
        task_id="t",
        samples=[s],
        outcomes=[1.0 if ok else 0.0],
        step_labels=[["GOOD"]],
        origin="live" if user else "env",
        user_hashes=[user] if user else [],
    )


@pytest.fixture
async def nav_env(settings, nats_server):
    p = "m" + uuid.uuid4().hex[:8]
    settings.nats.stream, settings.nats.subject_prefix = p.upper(), p
    bus = await Bus(nats_server.url, nats_server.user, nats_server.password, stream=p.upper(), prefix=p).connect()
    yield settings, bus
    await bus.close()


async def _nav(settings):
    from actors.navigator import Navigator

    nav = Navigator(settings)
    await nav.start()
    return nav


async def _stream_state(bus, prefix):
    """Last version of every experience on the stream: id -> (state, support)."""
    from nats.js import api

    sub = await bus.js.subscribe(
        f"{prefix}.experience", ordered_consumer=True, config=api.ConsumerConfig(deliver_policy=api.DeliverPolicy.ALL)
    )
    out = {}
    while True:
        try:
            m = await sub.next_msg(timeout=2.0)
        except (TimeoutError, asyncio.TimeoutError):
            break
        e = parse_event(m.data)
        out[e.experience_id] = (e.state, e.support)
    await sub.unsubscribe()
    return out


def _pool_state(pool):
    return {i: (m["state"], m.get("support", 1)) for i, m in pool.meta.items()}


async def test_merge_cap_utility_and_replay(nav_env):
    settings, bus = nav_env
    settings.memory.per_user_cap = 2
    nav = await _nav(settings)
    try:
        await nav.handle_judgement(_judgement("Please create a folder called reports in my home"), None)
        await nav.handle_judgement(_judgement("Please create a folder called reports in my home!"), None)
        assert nav.merged == 1 and len(nav.pool.meta) == 1
        (only,) = nav.pool.meta.values()
        assert only["support"] == 2 and len(only["sources"]) == 2
        assert "mkdir" in only["text"] and "dir_name" in only["text"]  # the call itself, not just its name

        for q in ["Book a flight to Paris for tomorrow", "What is the weather in Oslo", "Send a message to Bob about lunch"]:
            await nav.handle_judgement(_judgement(q, user="u1"), None)
            await asyncio.sleep(0.01)
        mine = [m for m in nav.pool.meta.values() if m.get("user_hash") == "u1"]
        assert sorted(m["state"] for m in mine) == ["active", "active", "retired"]
        assert next(m for m in mine if m["state"] == "retired")["when"].startswith("Book a flight")

        victim = next(i for i, m in nav.pool.meta.items() if m.get("user_hash") == "u1" and m["state"] == "active")
        for _ in range(5):
            nav._use(victim, False)
        assert await nav.sweep() == 1 and nav.pool.meta[victim]["state"] == "retired"
        hits = (await nav.retrieve(__import__("actors.events").events.RetrieveRequest(query="weather Oslo"))).experiences
        assert victim not in [h.experience_id for h in hits]

        before = _pool_state(nav.pool)
        assert await _stream_state(bus, settings.nats.subject_prefix) == before
    finally:
        await nav.shutdown()
    # lose the database (and its watermark): a navigator on an empty state dir rebuilds it exactly from the
    # stream. (Milvus Lite serves a data dir from inside the process that opened it, so the loss is
    # simulated with a fresh directory rather than by deleting the open one.)
    settings.state_dir = str(settings.state.parent / "state-after-loss")
    nav = await _nav(settings)
    try:
        assert nav.rebuilt == 7 and _pool_state(nav.pool) == before
    finally:
        await nav.shutdown()
    nav = await _nav(settings)  # consistent: nothing to replay
    try:
        assert nav.rebuilt == 0
    finally:
        await nav.shutdown()
    mark = settings.state / "milvus" / "applied_seq"  # a pool that disagrees with its watermark is replayed
    mark.write_text(json.dumps({**json.loads(mark.read_text()), "rows": 99}))
    nav = await _nav(settings)
    try:
        assert nav.rebuilt == 7 and _pool_state(nav.pool) == before
    finally:
        await nav.shutdown()
    # a write cut off mid-file (the database opens but cannot be loaded): moved aside, rebuilt from the stream
    for idx in (settings.state / "milvus" / "experiences.db").rglob("*.idx"):
        idx.write_bytes(idx.read_bytes()[: idx.stat().st_size // 2])
    nav = await _nav(settings)
    try:
        assert nav.rebuilt == 7 and _pool_state(nav.pool) == before
        assert list((settings.state / "milvus").glob("experiences.db.unreadable-*"))
    finally:
        await nav.shutdown()


async def test_snapshot_keeps_memory_that_retention_dropped_from_the_stream(nav_env):
    """The stream has retention limits: a snapshot (rows + the stream sequence they reflect) plus the events
    after it rebuild the pool exactly, though the events before it are gone."""
    import shutil

    settings, bus = nav_env
    nav = await _nav(settings)
    try:
        for q in ["Create a folder called reports", "What is the weather in Oslo"]:
            await nav.handle_judgement(_judgement(q), None)
        await nav._snapshot()
        seq = nav.watermark.seq()
        await bus.js.purge_stream(settings.nats.stream, seq=seq + 1)  # what max_age / max_bytes do to old events
        await nav.handle_judgement(_judgement("Send a message to Bob about lunch"), None)
        before = _pool_state(nav.pool)
        assert len(before) == 3
    finally:
        await nav.shutdown()
    snap = settings.state / "milvus" / "snapshot.jsonl"
    settings.state_dir = str(settings.state.parent / "state-restored")
    (settings.state / "milvus").mkdir(parents=True)
    shutil.copy(snap, settings.state / "milvus" / "snapshot.jsonl")  # the database itself is lost
    nav = await _nav(settings)
    try:
        assert nav.rebuilt == 1 and _pool_state(nav.pool) == before  # 2 from the snapshot, 1 replayed
        hits = (await nav.retrieve(__import__("actors.events").events.RetrieveRequest(query="folder reports"))).experiences
        assert hits and "mkdir" in hits[0].text
    finally:
        await nav.shutdown()


def test_guided_helped_and_utility():
    from policies.memory.experience import guided_helped, utility

    j = _judgement("q")
    j.samples = [j.samples[0].model_copy(update={"guided": True, "experience_ids": ["e1"]}), j.samples[0]]
    j.outcomes = [1.0, 0.0]
    assert guided_helped(j) == {"e1": True}
    j.outcomes = [0.0, 1.0]
    assert guided_helped(j) == {"e1": False}
    assert utility(0, 0) == 0.5 and utility(5, 0) < 0.3 < utility(5, 3)


async def test_kill_9_mid_write_loses_nothing(nav_env, nats_server):
    """The navigator runs in its own process; it is SIGKILLed while judgements are being written, started
    again, and must end with every judgement's experience in the pool and the pool equal to the stream."""
    from envs.bfcl import load_category

    settings, bus = nav_env
    settings.state.mkdir(parents=True, exist_ok=True)
    (settings.state / "settings.json").write_text(settings.model_dump_json())
    script = (
        "import asyncio, sys; sys.path.insert(0, %r)\n"
        "from config.settings import Settings\nfrom actors.navigator import Navigator\n"
        "s = Settings.model_validate_json(open(%r).read())\nasyncio.run(Navigator(s).run())\n"
        % (str(ROOT), str(settings.state / "settings.json"))
    )
    env = {**os.environ, "KAIZEN_STRICT_EVENTS": "1"}
    entries, _ = load_category("base")
    queries = list(dict.fromkeys(e["question"][0][0]["content"][:150] for e in entries.values()))[:60]
    for i, q in enumerate(queries):
        await bus.publish(_judgement(q, jid=f"j-{i:03d}"))
    n = len(queries)

    async def delivered():
        try:
            return int((await bus.consumer_info("navigator")).delivered.consumer_seq)
        except Exception:
            return 0

    proc = subprocess.Popen([sys.executable, "-c", script], env=env, start_new_session=True)
    try:
        for _ in range(1200):  # kill once some judgements are through: in the middle of the writes
            await asyncio.sleep(0.05)
            if await delivered() >= 24:
                break
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        partial = await _stream_state(bus, settings.nats.subject_prefix)
        assert 0 < len(partial) < n, f"not killed mid-write: {len(partial)} of {n} written"
        proc = subprocess.Popen([sys.executable, "-c", script], env=env, start_new_session=True)
        for _ in range(240):
            await asyncio.sleep(1.0)
            info = await bus.consumer_info("navigator")
            if info.num_pending == 0 and info.num_ack_pending == 0:
                break
        await asyncio.sleep(2.0)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    stream = await _stream_state(bus, settings.nats.subject_prefix)
    from policies.memory.pool import MemoryPool

    pool = MemoryPool(str(settings.state / "milvus" / "experiences.db"), settings.embedding.dim)
    assert _pool_state(pool) == stream  # the index matches the stream
    sources = sorted(s for m in pool.meta.values() for s in m["sources"])
    assert sources == [f"j-{i:03d}" for i in range(n)]  # every judgement landed exactly once
