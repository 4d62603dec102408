"""The live pointer in a JetStream key-value bucket, on a real nats-server, with stand-in engines. Two state dirs
play two nodes that share no disk: node A is the broadcaster's, node B a serve replica's (its pointer copy and its
files are its own)."""

import asyncio
import os
import shutil

from bus_nodes import connect, node, replica_of, save, stream_name, until  # noqa: E402  (tests/unit is on sys.path)

from actors.events import WeightsRef
from policies.weights.model_store import file_stat, sha256_file


def test_the_kv_watch_wakes_a_replica_and_its_engines_follow_the_pointer(tmp_path, nats_server):
    async def go():
        stream = stream_name()
        a, b = node(tmp_path, "a", nats_server, stream), node(tmp_path, "b", nats_server, stream)
        r1, r2 = save(a, 1), save(a, 2)
        a.publish_live(r1)  # written before the broadcaster attached (a pointer repaired on its start)
        nc_a, nc_b = await connect(nats_server), await connect(nats_server)
        await a.attach(nc_a.jetstream(), writer=True)
        assert (await a.board.get()).version == "w-000001"  # the writer put its copy in the bucket
        replica, reports = replica_of(b)
        assert replica.engine.version == "w-000000"  # node B had no pointer yet
        watch = asyncio.create_task(replica.watch(nc_b))
        await until(lambda: replica.engine.version == "w-000001")  # the current value, on the watch's start
        assert b.pointer().version == "w-000001" and reports[0].reason == "joined"

        await a.announce(r1, canary=r2, share=0.5)
        waited = await until(lambda: replica.engines.canary is not None)
        assert replica.engines.canary.version == "w-000002" and replica.engines.share == 0.5
        assert waited < 2.0  # woken by the watch (there is no poll)
        assert b.pointer().canary.version == "w-000002"  # node B's copy in its own state dir
        await a.announce(r2)
        await until(lambda: reports[-1].version == "w-000002")  # reported once the swap is done
        assert reports[-1].reason == "promoted" and replica.engines.canary is None

        # back to the base: the pointer pins node A's base file; node B has its own copy (another mtime),
        # whose sha256 it checks once before loading it
        a_base, b_base = tmp_path / "a-base" / "model.safetensors", tmp_path / "b-base" / "model.safetensors"
        os.utime(b_base, ns=(10**18, 10**18))  # converted at another time there (same bytes)
        base = WeightsRef(version="w-000000", path=str(a_base), sha256=sha256_file(a_base), parent="", step=0)
        assert a.store.verify(a_base, base.sha256)  # node A's stat, pinned in the pointer
        shutil.rmtree(tmp_path / "a-base")  # not on node B
        await a.announce(base)
        await until(lambda: replica.engine.version == "w-000000")
        assert replica.engine.loads[-1] == ("w-000000", str(b_base)) and b.store.pinned(b_base) == file_stat(b_base)
        watch.cancel()
        await nc_a.close()
        await nc_b.close()

    asyncio.run(go())


def test_a_replica_started_with_the_bus_down_serves_the_pointer_it_saw_last(tmp_path):
    from deploy.nats import EmbeddedNats

    server = EmbeddedNats(tmp_path / "nats", sync_always=False).start()

    async def seen_on_b():
        stream = stream_name()
        a = node(tmp_path, "a", server, stream, store="nats")
        b = node(tmp_path, "b", server, stream, store="nats")
        nc_a, nc_b = await connect(server), await connect(server)
        await a.attach(nc_a.jetstream(), writer=True)
        r1 = await asyncio.to_thread(save, a, 1)
        await b.attach(nc_b.jetstream())  # follows the key: keeps node B's copy
        await a.announce(r1)
        await until(lambda: b.pointer().version == "w-000001")
        shutil.rmtree(tmp_path / "a" / "weights")  # the path the pointer names is not on node B
        assert await asyncio.to_thread(b.sync) == "w-000001"  # fetched into node B's state dir
        await nc_a.close()
        await nc_b.close()

    try:
        asyncio.run(seen_on_b())
    finally:
        server.stop()
    shutil.rmtree(tmp_path / "a")  # node A's state dir is gone as well: B needs nothing of it
    b2 = node(tmp_path, "b", server, "unused")  # a new replica process on node B, no bus
    replica, _ = replica_of(b2)
    assert replica.engine.version == "w-000001"
    assert replica.engine.loads == [("w-000001", str(tmp_path / "b" / "weights" / "w-000001.safetensors"))]


def test_the_watch_resumes_after_a_bus_outage(tmp_path):
    """nats-server restarts (same port and store): the bucket's watch re-creates its consumer by itself and the
    replica follows a pointer moved after the outage."""
    from deploy.nats import EmbeddedNats

    server = EmbeddedNats(tmp_path / "nats", sync_always=False).start()

    async def go():
        stream = stream_name()
        a, b = node(tmp_path, "a", server, stream), node(tmp_path, "b", server, stream)
        r1, r2 = save(a, 1), save(a, 2)
        nc_a, nc_b = await connect(server), await connect(server)
        await a.attach(nc_a.jetstream(), writer=True)
        replica, _ = replica_of(b)
        watch = asyncio.create_task(replica.watch(nc_b))
        await a.announce(r1)
        await until(lambda: replica.engine.version == "w-000001")
        await asyncio.to_thread(server.stop)
        await asyncio.sleep(1.0)
        await asyncio.to_thread(server.start)
        await until(lambda: nc_a.is_connected and nc_b.is_connected)
        await a.announce(r2)
        await until(lambda: replica.engine.version == "w-000002", timeout=30.0)
        assert not watch.done()
        watch.cancel()
        await nc_a.close()
        await nc_b.close()

    try:
        asyncio.run(go())
    finally:
        server.stop()


def test_a_pointer_older_than_the_nodes_copy_by_the_writers_clock_is_still_followed(tmp_path, nats_server):
    """The node's copy says it was written later than the new pointer (a broadcaster restarted on a node whose
    clock is behind): the copy on disk keeps the newest by that clock, but the replica follows the bus."""

    async def go():
        stream = stream_name()
        a, b = node(tmp_path, "a", nats_server, stream), node(tmp_path, "b", nats_server, stream)
        r1 = save(a, 1)
        b.store.keep_live(b.pointer().model_copy(update={"at": 4e9}))  # from a writer whose clock was ahead
        nc_a, nc_b = await connect(nats_server), await connect(nats_server)
        await a.attach(nc_a.jetstream(), writer=True)
        replica, _ = replica_of(b)
        watch = asyncio.create_task(replica.watch(nc_b))
        await a.announce(r1)
        await until(lambda: replica.engine.version == "w-000001")
        assert b.pointer().version == "w-000001" and b.store.live().at == 4e9
        watch.cancel()
        await nc_a.close()
        await nc_b.close()

    asyncio.run(go())


def test_an_event_handler_reads_the_pointer_as_the_bus_holds_it(tmp_path, nats_server):
    """The broadcaster puts the pointer before it publishes the event that announces it; a handler of that event
    (the learner's, on a rejection) asks the bucket, which already has it, whether or not the watch delivered it."""

    async def go():
        stream = stream_name()
        a, b = node(tmp_path, "a", nats_server, stream), node(tmp_path, "b", nats_server, stream)
        r1, r2 = save(a, 1), save(a, 2)
        nc_a, nc_b = await connect(nats_server), await connect(nats_server)
        await a.attach(nc_a.jetstream(), writer=True)
        await b.attach(nc_b.jetstream(), follow=False)  # no watch: only the bucket knows
        await a.announce(r1, canary=r2, share=0.25)
        ptr = await b.current()
        assert (ptr.version, ptr.canary.version) == ("w-000001", "w-000002") and b.pointer().version == "w-000000"
        await nc_b.close()
        assert (await b.current()).version == "w-000000"  # the bus does not answer: this node's copy
        await nc_a.close()

    asyncio.run(go())
