"""Weights versions in the JetStream object store (`weights.store: nats`), on a real nats-server, with stand-in
engines. Two state dirs play two nodes that share no disk: node A is the learner's (and the broadcaster's unless a
test says otherwise), node B a serve replica's; a version reaches B only through the bus."""

import asyncio
import shutil

import pytest
from bus_nodes import connect, node, replica_of, save, stream_name, two_nodes, until  # noqa: E402  (tests/unit is on sys.path)

from policies.weights.model_store import file_stat, sha256_file


def test_a_version_is_fetched_into_an_empty_second_state_dir_verified_once_and_loaded(tmp_path, nats_server, monkeypatch):
    async def go():
        stream, a, b, log, nc_a, nc_b = await two_nodes(tmp_path, nats_server)
        r1 = await asyncio.to_thread(save, a, 1)  # uploaded before the manifest exists
        assert await a.objects.names() == ["w-000001"]
        ptr = await a.announce(r1)
        pinned = ptr.stat
        shutil.rmtree(tmp_path / "a" / "weights")  # the path the pointer names is not on node B
        replica, _ = replica_of(b, log)  # started before its bus: the version is not on node B yet
        assert replica.engine.version == "w-000000"
        watch = asyncio.create_task(replica.watch(nc_b))
        await until(lambda: replica.engine.version == "w-000001")
        local = tmp_path / "b" / "weights" / "w-000001.safetensors"
        assert replica.engine.loads == [("w-000001", str(local))]
        assert sha256_file(local) == r1.sha256 and b.store.manifest("w-000001")["path"] == str(local)
        assert file_stat(local) == pinned  # the origin's mtime kept: the pointer's pin holds on node B
        assert "weights.fetched" in log.events("info") and not log.events("error")
        assert not list((tmp_path / "b" / "weights").glob(".*.fetch"))  # no temp file left

        import policies.weights.model_store as store
        import serve.weights as engines  # another replica on node B: a stat, not a hash

        for module in (engines, store):
            monkeypatch.setattr(module, "sha256_file", lambda p: pytest.fail("re-hashed a verified file"))
        other = node(tmp_path, "b", nats_server, stream, store="nats")
        other_replica, _ = replica_of(other)
        assert other_replica.engine.version == "w-000001"
        watch.cancel()
        await nc_a.close()
        await nc_b.close()

    asyncio.run(go())


def test_a_mismatched_digest_is_refused_and_never_loaded(tmp_path, nats_server):
    from nats.js.api import ObjectMeta

    async def go():
        stream, a, b, log, nc_a, nc_b = await two_nodes(tmp_path, nats_server)
        r1, r2 = await asyncio.to_thread(save, a, 1), await asyncio.to_thread(save, a, 2)
        info = await a.objects.obs.get_info("w-000001")  # w-1 replaced by other bytes under its manifest
        await a.objects.obs.put("w-000001", b"not the weights", meta=ObjectMeta(description=info.description))
        await a.announce(r1)
        shutil.rmtree(tmp_path / "a" / "weights")
        replica, _ = replica_of(b, log)
        watch = asyncio.create_task(replica.watch(nc_b))
        await until(lambda: "weights.digest_mismatch" in log.events("error"))
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
        stream, a, b, log, nc_a, nc_b = await two_nodes(tmp_path, nats_server)
        r1 = await asyncio.to_thread(save, a, 1)
        info = await a.objects.obs.get_info("w-000001")
        info.digest = "SHA-256=" + base64.urlsafe_b64encode(bytes(32)).decode()
        subject = OBJ_META_PRE_TEMPLATE.format(bucket=a.objects.bucket, obj=base64.urlsafe_b64encode(b"w-000001").decode())
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
        stream = stream_name()
        a = node(tmp_path, "a", nats_server, stream, store="nats")
        b1, b2 = (node(tmp_path, "b", nats_server, stream, store="nats") for _ in range(2))
        ncs = [await connect(nats_server) for _ in range(3)]
        await a.attach(ncs[0].jetstream(), writer=True)
        r1 = await asyncio.to_thread(save, a, 1)
        for p, nc in ((b1, ncs[1]), (b2, ncs[2])):
            await p.attach(nc.jetstream(), follow=False)
        shutil.rmtree(tmp_path / "a" / "weights")
        got = await asyncio.gather(
            asyncio.to_thread(b1.file, "w-000001", r1.path, r1.sha256), asyncio.to_thread(b2.file, "w-000001", r1.path, r1.sha256)
        )
        assert gets == ["w-000001"] and got[0] == got[1] == tmp_path / "b" / "weights" / "w-000001.safetensors"
        for nc in ncs:
            await nc.close()

    asyncio.run(go())


def test_pruning_removes_versions_from_the_object_store(tmp_path, nats_server):
    async def go():
        stream = stream_name()
        a = node(tmp_path, "a", nats_server, stream, store="nats")
        nc = await connect(nats_server)
        await a.attach(nc.jetstream(), writer=True)
        for n in (1, 2, 3, 4):
            await asyncio.to_thread(save, a, n)
        assert await a.objects.names() == ["w-000001", "w-000002", "w-000003", "w-000004"]
        assert a.store.prune(2, protect={"w-000001"}) == ["w-000002"]  # on the loop, as the broadcaster prunes
        await a.objects.settle()
        assert await a.objects.names() == ["w-000001", "w-000003", "w-000004"]
        assert await asyncio.to_thread(a.store.prune, 1, {"w-000000"}) == ["w-000001", "w-000003"]
        assert await a.objects.names() == ["w-000004"]

        # a follower node drops what it fetched once the bucket no longer has it
        b = node(tmp_path, "b", nats_server, stream, store="nats")
        nc_b = await connect(nats_server)
        await b.attach(nc_b.jetstream(), follow=False)
        assert await asyncio.to_thread(b.objects.fetch, "w-000004")
        r5 = await asyncio.to_thread(save, a, 5)
        await asyncio.to_thread(save, a, 6)
        assert await asyncio.to_thread(a.store.prune, 1, {"w-000000", "w-000005"}) == ["w-000004"]
        assert await a.objects.names() == ["w-000005", "w-000006"]
        assert await asyncio.to_thread(b.objects.fetch, "w-000005", r5.sha256)
        assert sorted(p.name for p in b.store.dir.glob("w-*")) == ["w-000005.json", "w-000005.safetensors"]
        await nc_b.close()
        await nc.close()

    asyncio.run(go())


def test_a_broadcaster_on_another_node_than_the_learner_fetches_what_it_stages(tmp_path, nats_server):
    """The learner saved and published from node A; the broadcaster runs on node B: it fetches the version,
    checks its sha256, and keeps it in its book with node B's path (its gate and its pointer use that)."""
    from actors.broadcaster import Broadcaster
    from actors.events import WeightsPublished, WeightsStatus
    from actors.lifecycles import WeightsState as S
    from policies.promotion.book import PromotionBook

    class FakeBus:
        def __init__(self):
            self.events = []

        async def publish(self, ev, weights_version=None):
            self.events.append(ev)

    async def go():
        stream = stream_name()
        learner = node(tmp_path, "a", nats_server, stream, store="nats")
        gate = node(tmp_path, "b", nats_server, stream, store="nats")
        nc_a, nc_b = await connect(nats_server), await connect(nats_server)
        await learner.attach(nc_a.jetstream(), follow=False)
        await gate.attach(nc_b.jetstream(), writer=True)
        r1 = await asyncio.to_thread(save, learner, 1)
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
