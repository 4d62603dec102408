"""Two nodes on one machine for the tests of the pointer's key-value bucket and the weights object store: each
node a state dir and a base model copy of its own, a real nats-server between them, stand-in engines."""

import asyncio
import time
import uuid

import nats
import torch

from actors.events import WeightsRef
from config.settings import load_settings
from policies.engines.live_policy import LivePolicy
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


def settings_for(tmp_path, name, server, stream, store="state_dir"):
    return load_settings(
        None,
        state_dir=str(tmp_path / name),
        **{"nats.url": server.url, "nats.password": server.password, "nats.stream": stream, "weights.store": store},
    )


def node(tmp_path, name, server, stream, store="state_dir", log=None):
    base = tmp_path / f"{name}-base"  # each node has its own copy of the base model
    if not base.exists():
        base.mkdir()
        from safetensors.torch import save_file

        save_file({"w": torch.zeros(2)}, str(base / "model.safetensors"))
    p = LivePolicy(settings_for(tmp_path, name, server, stream, store), engine=FakeEngine(), base=base, log=log)
    p.make_engine = lambda role: FakeEngine()
    return p


def save(policy, n: int) -> WeightsRef:
    v = f"w-{n:06d}"
    path, sha = policy.store.save({"w": torch.full((2,), float(n))}, v, {"parent": f"w-{n - 1:06d}", "step": n})
    return WeightsRef(version=v, path=str(path), sha256=sha, parent=f"w-{n - 1:06d}", step=n)


async def until(check, timeout=10.0):
    t0 = time.monotonic()
    while not check():
        assert time.monotonic() - t0 < timeout, "timed out"
        await asyncio.sleep(0.05)
    return time.monotonic() - t0


async def connect(server):
    return await nats.connect(
        server.url, user=server.user, password=server.password, max_reconnect_attempts=-1, reconnect_time_wait=0.2
    )


def replica_of(policy, log=None):
    reports = []

    async def report(ev):
        reports.append(ev)

    return ReplicaWeights(policy, "replica-b", "evo", report, log or Log()), reports


def stream_name():
    return f"T{uuid.uuid4().hex[:10]}"


async def two_nodes(tmp_path, server, store="nats"):
    """Node A, the writer, attached to the bus; node B (whose log is returned) not yet: (stream, a, b, log of b,
    connection of a, connection of b)."""
    stream, log = stream_name(), Log()
    a = node(tmp_path, "a", server, stream, store=store)
    b = node(tmp_path, "b", server, stream, store=store, log=log)
    nc_a, nc_b = await connect(server), await connect(server)
    await a.attach(nc_a.jetstream(), writer=True)
    return stream, a, b, log, nc_a, nc_b
