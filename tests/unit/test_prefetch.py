"""A replica with weights in the bus's object store fetches each published version as the learner publishes it
(`ReplicaWeights.prefetch`), so that the swap to it finds the file; a poison event or a failed fetch is logged and
left to the swap."""

import types

from actors.events import WeightsPublished, WeightsRef, WeightsSwapped
from serve.weights import ReplicaWeights


class Log:
    def __init__(self):
        self.warnings = []

    def warning(self, event, **kw):
        self.warnings.append((event, kw))


def _replica(fetch):
    """A ReplicaWeights without its engines: only `prefetch` runs here."""
    rw = ReplicaWeights.__new__(ReplicaWeights)
    rw.policy, rw.log = types.SimpleNamespace(file=fetch), Log()
    return rw


def _msg(ev) -> types.SimpleNamespace:
    return types.SimpleNamespace(data=ev.model_dump_json().encode() if hasattr(ev, "model_dump_json") else ev)


async def test_a_published_version_is_fetched_with_the_sha256_the_learner_published():
    calls = []
    rw = _replica(lambda *a: calls.append(a))
    ref = WeightsRef(version="w-000007", path="/elsewhere/w-000007.safetensors", sha256="ab" * 32, parent="w-000006", step=7)
    await rw.prefetch(_msg(WeightsPublished(weights=ref)))
    assert calls == [("w-000007", "/elsewhere/w-000007.safetensors", "ab" * 32)]
    assert rw.log.warnings == []


async def test_other_events_fetch_nothing_and_poison_or_a_failed_fetch_is_logged_not_raised():
    calls = []
    rw = _replica(lambda *a: calls.append(a))
    await rw.prefetch(_msg(WeightsSwapped(replica="r", version="w-000001", swap_ms=1.0)))
    await rw.prefetch(_msg(b"{not json"))
    assert calls == [] and [w[0] for w in rw.log.warnings] == ["weights.prefetch_failed"]

    def broken(*a):
        raise OSError("the object store went away")

    rw = _replica(broken)
    ref = WeightsRef(version="w-000002", path="p", sha256="cd" * 32, parent="w-000001", step=2)
    await rw.prefetch(_msg(WeightsPublished(weights=ref)))
    assert "the object store went away" in rw.log.warnings[0][1]["error"]
