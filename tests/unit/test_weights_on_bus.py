"""The live pointer in a JetStream key-value bucket and weights versions in its object store, on a real
nats-server, with stand-in engines. Two state dirs play two nodes that share no disk: node A is the
broadcaster's and the learner's, node B a serve replica's (its pointer and files are its own)."""
import asyncio
import os
import shutil
import time
import uuid

import nats
import pytest
import torch

from actors.events import WeightsRef
from config.settings import load_settings
from policies.live_policy import LivePolicy
from policies.model_store import file_stat, sha256_file
from serve.weights import ReplicaWeights


class FakeEngine:
    def __init__(self, version="w-000000"):
        self.version, self.loads = version, []

    def load_weights(self, path, version):
        self.loads.append((version, str(path)))
        self.version = version


class Log:
    """Records what is logged (structlog's keyword style)."""

    def __init__(self):
        self.lines = []

    def __getattr__(self, level):
        return lambda event, **kw: self.lines.append((level, event, kw))

    def events(self, level):
        return [e for lv, e, _ in self.lines if lv == level]


def _settings(tmp_path, node, server, stream, store="state_dir"):
    return load_settings(None, state_dir=str(tmp_path / node), **{
        "nats.url": server.url, "nats.password": server.password, "nats.stream": stream, "weights.store": store})


def _node(tmp_path, node, server, stream, store="state_dir", log=None):
    base = tmp_path / f"{node}-base"  # each node has its own copy of the base model
    if not base.exists():
        base.mkdir()
        from safetensors.torch import save_file
        save_file({"w": torch.zeros(2)}, str(base / "model.safetensors"))
    p = LivePolicy(_settings(tmp_path, node, server, stream, store), engine=FakeEngine(), base=base, log=log)
    p.make_engine = lambda role: FakeEngine()
    return p


def _save(policy, n: int) -> WeightsRef:
    v = f"w-{n:06d}"
    path, sha = policy.store.save({"w": torch.full((2,), float(n))}, v, {"parent": f"w-{n - 1:06d}", "step": n})
    return WeightsRef(version=v, path=str(path), sha256=sha, parent=f"w-{n - 1:06d}", step=n)


async def _until(check, timeout=10.0):
    t0 = time.monotonic()
    while not check():
        assert time.monotonic() - t0 < timeout, "timed out"
        await asyncio.sleep(0.05)
    return time.monotonic() - t0


async def _connect(server):
    return await nats.connect(server.url, user=server.user, password=server.password, max_reconnect_attempts=-1,
                              reconnect_time_wait=0.2)


def _replica(policy, log=None):
    reports = []

    async def report(ev):
        reports.append(ev)
    return ReplicaWeights(policy, "replica-b", "evo", report, log or Log()), reports


def _stream():
    return f"T{uuid.uuid4().hex[:10]}"


def test_the_kv_watch_wakes_a_replica_and_its_engines_follow_the_pointer(tmp_path, nats_server):
    async def go():
        stream = _stream()
        a, b = _node(tmp_path, "a", nats_server, stream), _node(tmp_path, "b", nats_server, stream)
        r1, r2 = _save(a, 1), _save(a, 2)
        a.publish_live(r1)  # written before the broadcaster attached (a pointer repaired on its start)
        nc_a, nc_b = await _connect(nats_server), await _connect(nats_server)
        await a.attach(nc_a.jetstream(), writer=True)
        assert (await a.board.get()).version == "w-000001"  # the writer put its copy in the bucket
        replica, reports = _replica(b)
        assert replica.engine.version == "w-000000"  # node B had no pointer yet
        watch = asyncio.create_task(replica.watch(nc_b))
        await _until(lambda: replica.engine.version == "w-000001")  # the current value, on the watch's start
        assert b.pointer().version == "w-000001" and reports[0].reason == "joined"

        await a.announce(r1, canary=r2, share=0.5)
        waited = await _until(lambda: replica.engines.canary is not None)
        assert replica.engines.canary.version == "w-000002" and replica.engines.share == 0.5
        assert waited < 2.0  # woken by the watch (there is no poll)
        assert b.pointer().canary.version == "w-000002"  # node B's copy in its own state dir
        await a.announce(r2)
        await _until(lambda: reports[-1].version == "w-000002")  # reported once the swap is done
        assert reports[-1].reason == "promoted" and replica.engines.canary is None

        # back to the base: the pointer pins node A's base file; node B has its own copy (another mtime),
        # whose sha256 it checks once before loading it
        a_base, b_base = tmp_path / "a-base" / "model.safetensors", tmp_path / "b-base" / "model.safetensors"
        os.utime(b_base, ns=(10**18, 10**18))  # converted at another time there (same bytes)
        base = WeightsRef(version="w-000000", path=str(a_base), sha256=sha256_file(a_base), parent="", step=0)
        assert a.store.verify(a_base, base.sha256)  # node A's stat, pinned in the pointer
        shutil.rmtree(tmp_path / "a-base")  # not on node B
        await a.announce(base)
        await _until(lambda: replica.engine.version == "w-000000")
        assert replica.engine.loads[-1] == ("w-000000", str(b_base)) and b.store.pinned(b_base) == file_stat(b_base)
        watch.cancel()
        await nc_a.close()
        await nc_b.close()
    asyncio.run(go())


def test_a_replica_started_with_the_bus_down_serves_the_pointer_it_saw_last(tmp_path):
    from deploy.nats import EmbeddedNats

    server = EmbeddedNats(tmp_path / "nats", sync_always=False).start()

    async def seen_on_b():
        stream = _stream()
        a = _node(tmp_path, "a", server, stream, store="nats")
        b = _node(tmp_path, "b", server, stream, store="nats")
        nc_a, nc_b = await _connect(server), await _connect(server)
        await a.attach(nc_a.jetstream(), writer=True)
        r1 = await asyncio.to_thread(_save, a, 1)
        await b.attach(nc_b.jetstream())  # follows the key: keeps node B's copy
        await a.announce(r1)
        await _until(lambda: b.pointer().version == "w-000001")
        shutil.rmtree(tmp_path / "a" / "weights")  # the path the pointer names is not on node B
        assert await asyncio.to_thread(b.sync) == "w-000001"  # fetched into node B's state dir
        await nc_a.close()
        await nc_b.close()
    try:
        asyncio.run(seen_on_b())
    finally:
        server.stop()
    shutil.rmtree(tmp_path / "a")  # node A's state dir is gone as well: B needs nothing of it
    b2 = _node(tmp_path, "b", server, "unused")  # a new replica process on node B, no bus
    replica, _ = _replica(b2)
    assert replica.engine.version == "w-000001"
    assert replica.engine.loads == [("w-000001", str(tmp_path / "b" / "weights" / "w-000001.safetensors"))]


def test_a_version_is_fetched_into_an_empty_second_state_dir_verified_once_and_loaded(tmp_path, nats_server,
                                                                                       monkeypatch):
    async def go():
        stream = _stream()
        a, log = _node(tmp_path, "a", nats_server, stream, store="nats"), Log()
        b = _node(tmp_path, "b", nats_server, stream, store="nats", log=log)
        nc_a, nc_b = await _connect(nats_server), await _connect(nats_server)
        await a.attach(nc_a.jetstream(), writer=True)
        r1 = await asyncio.to_thread(_save, a, 1)  # uploaded before the manifest exists
        assert await a.objects.names() == ["w-000001"]
        ptr = await a.announce(r1)
        pinned = ptr.stat
        shutil.rmtree(tmp_path / "a" / "weights")  # the path the pointer names is not on node B
        replica, _ = _replica(b, log)  # started before its bus: the version is not on node B yet
        assert replica.engine.version == "w-000000"
        watch = asyncio.create_task(replica.watch(nc_b))
        await _until(lambda: replica.engine.version == "w-000001")
        local = tmp_path / "b" / "weights" / "w-000001.safetensors"
        assert replica.engine.loads == [("w-000001", str(local))]
        assert sha256_file(local) == r1.sha256 and b.store.manifest("w-000001")["path"] == str(local)
        assert file_stat(local) == pinned  # the origin's mtime kept: the pointer's pin holds on node B
        assert "weights.fetched" in log.events("info") and not log.events("error")
        assert not list((tmp_path / "b" / "weights").glob(".*.fetch"))  # no temp file left

        import policies.model_store as store
        import serve.weights as engines  # another replica on node B: a stat, not a hash
        for module in (engines, store):
            monkeypatch.setattr(module, "sha256_file", lambda p: pytest.fail("re-hashed a verified file"))
        other = _node(tmp_path, "b", nats_server, stream, store="nats")
        other_replica, _ = _replica(other)
        assert other_replica.engine.version == "w-000001"
        watch.cancel()
        await nc_a.close()
        await nc_b.close()
    asyncio.run(go())


def test_a_mismatched_digest_is_refused_and_never_loaded(tmp_path, nats_server):
    from nats.js.api import ObjectMeta

    async def go():
        stream = _stream()
        a, log = _node(tmp_path, "a", nats_server, stream, store="nats"), Log()
        b = _node(tmp_path, "b", nats_server, stream, store="nats", log=log)
        nc_a, nc_b = await _connect(nats_server), await _connect(nats_server)
        await a.attach(nc_a.jetstream(), writer=True)
        r1, r2 = await asyncio.to_thread(_save, a, 1), await asyncio.to_thread(_save, a, 2)
        info = await a.objects.obs.get_info("w-000001")  # w-1 replaced by other bytes under its manifest
        await a.objects.obs.put("w-000001", b"not the weights", meta=ObjectMeta(description=info.description))
        await a.announce(r1)
        shutil.rmtree(tmp_path / "a" / "weights")
        replica, _ = _replica(b, log)
        watch = asyncio.create_task(replica.watch(nc_b))
        await _until(lambda: "weights.digest_mismatch" in log.events("error"))
        await asyncio.sleep(0.2)
        assert replica.engine.version == "w-000000" and replica.engine.loads == []
        assert "swap.sha_mismatch" in log.events("error")
        assert not (tmp_path / "b" / "weights" / "w-000001.safetensors").exists()
        assert not list((tmp_path / "b" / "weights").glob(".*.fetch"))

        # intact bytes, but not the version the pointer names (its sha256): refused as well
        assert await asyncio.to_thread(b.objects.fetch, "w-000002", "0" * 64) is None
        assert not (tmp_path / "b" / "weights" / "w-000002.safetensors").exists()
        assert await asyncio.to_thread(b.objects.fetch, "w-000002", r2.sha256) is not None
        watch.cancel()
        await nc_a.close()
        await nc_b.close()
    asyncio.run(go())


def test_bytes_that_do_not_match_the_object_stores_own_digest_are_refused(tmp_path, nats_server):
    """The object's digest (recorded by the object store at put) no longer matches its chunks: nats-py's check
    fails at the end of the transfer, and the fetch is refused before our own sha256 is even computed."""
    import base64
    import json

    from nats.js.object_store import OBJ_META_PRE_TEMPLATE

    async def go():
        stream = _stream()
        a, log = _node(tmp_path, "a", nats_server, stream, store="nats"), Log()
        b = _node(tmp_path, "b", nats_server, stream, store="nats", log=log)
        nc_a, nc_b = await _connect(nats_server), await _connect(nats_server)
        await a.attach(nc_a.jetstream(), writer=True)
        r1 = await asyncio.to_thread(_save, a, 1)
        info = await a.objects.obs.get_info("w-000001")
        info.digest = "SHA-256=" + base64.urlsafe_b64encode(bytes(32)).decode()
        subject = OBJ_META_PRE_TEMPLATE.format(bucket=a.objects.bucket,
                                               obj=base64.urlsafe_b64encode(b"w-000001").decode())
        await nc_a.jetstream().publish(subject, json.dumps(info.as_dict()).encode(), headers={"Nats-Rollup": "sub"})
        await b.attach(nc_b.jetstream(), follow=False)
        shutil.rmtree(tmp_path / "a" / "weights")
        assert await asyncio.to_thread(b.file, "w-000001", r1.path, r1.sha256) is None
        assert [kw["check"] for lv, e, kw in log.lines if e == "weights.digest_mismatch"] == ["object store SHA-256"]
        assert not (tmp_path / "b" / "weights" / "w-000001.safetensors").exists()
        assert not list((tmp_path / "b" / "weights").glob(".*.fetch"))
        await nc_a.close()
        await nc_b.close()
    asyncio.run(go())


def test_two_followers_on_one_node_fetch_a_version_once(tmp_path, nats_server, monkeypatch):
    from nats.js.object_store import ObjectStore

    gets = []
    real_get = ObjectStore.get

    async def counted(self, name, *args, **kwargs):
        gets.append(name)
        await asyncio.sleep(0.3)  # a slow transfer: the second follower arrives meanwhile
        return await real_get(self, name, *args, **kwargs)
    monkeypatch.setattr(ObjectStore, "get", counted)

    async def go():
        stream = _stream()
        a = _node(tmp_path, "a", nats_server, stream, store="nats")
        b1, b2 = (_node(tmp_path, "b", nats_server, stream, store="nats") for _ in range(2))
        ncs = [await _connect(nats_server) for _ in range(3)]
        await a.attach(ncs[0].jetstream(), writer=True)
        r1 = await asyncio.to_thread(_save, a, 1)
        for p, nc in ((b1, ncs[1]), (b2, ncs[2])):
            await p.attach(nc.jetstream(), follow=False)
        shutil.rmtree(tmp_path / "a" / "weights")
        got = await asyncio.gather(asyncio.to_thread(b1.file, "w-000001", r1.path, r1.sha256),
                                   asyncio.to_thread(b2.file, "w-000001", r1.path, r1.sha256))
        assert gets == ["w-000001"] and got[0] == got[1] == tmp_path / "b" / "weights" / "w-000001.safetensors"
        for nc in ncs:
            await nc.close()
    asyncio.run(go())


def test_pruning_removes_versions_from_the_object_store(tmp_path, nats_server):
    async def go():
        stream = _stream()
        a = _node(tmp_path, "a", nats_server, stream, store="nats")
        nc = await _connect(nats_server)
        await a.attach(nc.jetstream(), writer=True)
        for n in (1, 2, 3, 4):
            await asyncio.to_thread(_save, a, n)
        assert await a.objects.names() == ["w-000001", "w-000002", "w-000003", "w-000004"]
        assert a.store.prune(2, protect={"w-000001"}) == ["w-000002"]  # on the loop, as the broadcaster prunes
        await a.objects.settle()
        assert await a.objects.names() == ["w-000001", "w-000003", "w-000004"]
        assert await asyncio.to_thread(a.store.prune, 1, {"w-000000"}) == ["w-000001", "w-000003"]
        assert await a.objects.names() == ["w-000004"]

        # a follower node drops what it fetched once the bucket no longer has it
        b = _node(tmp_path, "b", nats_server, stream, store="nats")
        nc_b = await _connect(nats_server)
        await b.attach(nc_b.jetstream(), follow=False)
        assert await asyncio.to_thread(b.objects.fetch, "w-000004")
        r5 = await asyncio.to_thread(_save, a, 5)
        await asyncio.to_thread(_save, a, 6)
        assert await asyncio.to_thread(a.store.prune, 1, {"w-000000", "w-000005"}) == ["w-000004"]
        assert await a.objects.names() == ["w-000005", "w-000006"]
        assert await asyncio.to_thread(b.objects.fetch, "w-000005", r5.sha256)
        assert sorted(p.name for p in b.store.dir.glob("w-*")) == ["w-000005.json", "w-000005.safetensors"]
        await nc_b.close()
        await nc.close()
    asyncio.run(go())


def test_the_watch_resumes_after_a_bus_outage(tmp_path):
    """nats-server restarts (same port and store): the bucket's watch re-creates its consumer by itself and the
    replica follows a pointer moved after the outage."""
    from deploy.nats import EmbeddedNats

    server = EmbeddedNats(tmp_path / "nats", sync_always=False).start()

    async def go():
        stream = _stream()
        a, b = _node(tmp_path, "a", server, stream), _node(tmp_path, "b", server, stream)
        r1, r2 = _save(a, 1), _save(a, 2)
        nc_a, nc_b = await _connect(server), await _connect(server)
        await a.attach(nc_a.jetstream(), writer=True)
        replica, _ = _replica(b)
        watch = asyncio.create_task(replica.watch(nc_b))
        await a.announce(r1)
        await _until(lambda: replica.engine.version == "w-000001")
        await asyncio.to_thread(server.stop)
        await asyncio.sleep(1.0)
        await asyncio.to_thread(server.start)
        await _until(lambda: nc_a.is_connected and nc_b.is_connected)
        await a.announce(r2)
        await _until(lambda: replica.engine.version == "w-000002", timeout=30.0)
        assert not watch.done()
        watch.cancel()
        await nc_a.close()
        await nc_b.close()
    try:
        asyncio.run(go())
    finally:
        server.stop()


def test_a_broadcaster_on_another_node_than_the_learner_fetches_what_it_stages(tmp_path, nats_server):
    """The learner saved and published from node A; the broadcaster runs on node B: it fetches the version,
    checks its sha256, and keeps it in its book with node B's path (its gate and its pointer use that)."""
    from actors.broadcaster import Broadcaster
    from actors.events import WeightsPublished, WeightsStatus
    from actors.lifecycles import WeightsState as S
    from policies.promotion import PromotionBook

    class FakeBus:
        def __init__(self):
            self.events = []

        async def publish(self, ev, weights_version=None):
            self.events.append(ev)

    async def go():
        stream = _stream()
        learner = _node(tmp_path, "a", nats_server, stream, store="nats")
        gate = _node(tmp_path, "b", nats_server, stream, store="nats")
        nc_a, nc_b = await _connect(nats_server), await _connect(nats_server)
        await learner.attach(nc_a.jetstream())
        await gate.attach(nc_b.jetstream(), writer=True)
        r1 = await asyncio.to_thread(_save, learner, 1)
        shutil.rmtree(tmp_path / "a" / "weights")
        b = Broadcaster(gate.settings, bus=FakeBus())
        b.policy, b.store, b.base_path = gate, gate.store, gate.base
        b.book = PromotionBook(tmp_path / "book.json", {"w-000000": S.LIVE}, ["w-000000"])
        await b.handle_weights_published(WeightsPublished(weights=r1), None)
        local = tmp_path / "b" / "weights" / "w-000001.safetensors"
        assert b.book.status["w-000001"] == S.STAGED and b._ref("w-000001").path == str(local)
        assert [e.status for e in b.bus.events if isinstance(e, WeightsStatus)] == [S.STAGED]
        ptr = await gate.announce(b._ref("w-000001"))
        assert ptr.path == str(local) and ptr.stat == file_stat(local)
        await nc_a.close()
        await nc_b.close()
    asyncio.run(go())
