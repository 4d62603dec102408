"""Which weights the explorer samples training rollouts with (handlers called directly, no bus)."""

import asyncio

import pytest

from actors.events import WeightsPublished, WeightsRef, WeightsRejected, WeightsRolledBack
from actors.explorer import Explorer
from config.settings import load_settings
from policies.engines.live_policy import LivePolicy
from policies.weights.model_store import WeightsStore


class FakeEngine:
    def __init__(self):
        self.version = "w-000000"
        self.loads = []

    def load_weights(self, path, version):
        self.loads.append(version)
        self.version = version


def _publish(store: WeightsStore, n: int, parent: str) -> WeightsRef:
    import torch

    v = f"w-{n:06d}"
    path, sha = store.save({"w": torch.full((2,), float(n))}, v, {"parent": parent, "step": n})
    return WeightsRef(version=v, path=str(path), sha256=sha, parent=parent, step=n)


@pytest.fixture
def explorer(tmp_path):
    s = load_settings(None, state_dir=str(tmp_path))
    x = Explorer(s)
    x.policy = LivePolicy(s, engine=FakeEngine(), base=_base(tmp_path))
    x.engine = x.policy.engine
    return x


def _base(tmp_path):
    import torch
    from safetensors.torch import save_file

    (tmp_path / "base").mkdir(exist_ok=True)
    save_file({"w": torch.zeros(2)}, str(tmp_path / "base" / "model.safetensors"))
    return tmp_path / "base"


def run(coro):
    return asyncio.run(coro)


def test_explorer_follows_published_versions_and_drops_a_rejected_branch(explorer):
    x, store = explorer, explorer.policy.store
    r1 = _publish(store, 1, "w-000000")
    r2 = _publish(store, 2, "w-000001")
    run(x.handle_weights_published(WeightsPublished(weights=r1), None))
    run(x.handle_weights_published(WeightsPublished(weights=r2), None))
    run(x._follow())
    assert x.engine.version == "w-000002" and x.engine.loads == ["w-000002"]  # only the newest is loaded
    run(x._follow())
    assert x.engine.loads == ["w-000002"]  # unchanged target: no reload
    # w-000001 rejected: w-000002 descends from it, so sampling goes back to live, the base model
    run(x.handle_weights_rejected(WeightsRejected(weights=r1, candidate_score=0, live_score=0, reason="r"), None))
    assert x.policy.target is None
    run(x._follow())
    assert x.engine.version == "w-000000" and x.engine.loads == ["w-000002", "w-000000"]


def test_rejecting_an_unrelated_version_keeps_the_target(explorer):
    x, store = explorer, explorer.policy.store
    r1 = _publish(store, 1, "w-000000")
    r2 = _publish(store, 2, "w-000000")  # a sibling branch (the learner was reset to live)
    run(x.handle_weights_published(WeightsPublished(weights=r2), None))
    run(x.handle_weights_rejected(WeightsRejected(weights=r1, candidate_score=0, live_score=0, reason="r"), None))
    assert x.policy.target.version == "w-000002"
    run(x.handle_weights_rolled_back(WeightsRolledBack(from_version="w-000002", to=r1, reason="drop"), None))
    assert x.policy.target is None


def test_forced_and_live_mode_publications_are_not_followed(tmp_path):
    s = load_settings(None, state_dir=str(tmp_path), **{"rollout.weights": "live"})
    x = Explorer(s)
    x.policy = LivePolicy(s, engine=FakeEngine(), base=_base(tmp_path))
    x.engine = x.policy.engine
    run(x.handle_weights_published(WeightsPublished(weights=_publish(x.policy.store, 1, "w-000000")), None))
    assert x.policy.target is None
    y = Explorer(load_settings(None, state_dir=str(tmp_path / "b")))
    y.policy = LivePolicy(y.settings, engine=FakeEngine(), base=_base(tmp_path))
    run(y.handle_weights_published(WeightsPublished(weights=_publish(y.policy.store, 1, "w-000000"), force=True), None))
    assert y.policy.target is None


def test_a_pruned_target_falls_back_to_live(explorer):
    x, store = explorer, explorer.policy.store
    r1 = _publish(store, 1, "w-000000")
    run(x.handle_weights_published(WeightsPublished(weights=r1), None))
    store.path("w-000001").unlink()
    run(x._follow())
    assert x.policy.target is None and x.engine.version == "w-000000" and x.engine.loads == []
