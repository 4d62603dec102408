"""LivePolicy (the one follower of the live policy) and the broadcaster keeping LIVE a projection of the lifecycle."""

from pathlib import Path

import torch
from safetensors.torch import save_file

from actors.events import WeightsRef
from actors.lifecycles import WeightsState as S
from config.settings import load_settings
from policies.engines.live_policy import LivePolicy
from policies.promotion.book import PromotionBook
from policies.promotion.models import Canary


class FakeEngine:
    def __init__(self):
        self.version, self.loads = "w-000000", []

    def load_weights(self, path, version):
        self.loads.append((version, str(path)))
        self.version = version


def _policy(tmp_path):
    (tmp_path / "base").mkdir()
    save_file({"w": torch.zeros(2)}, str(tmp_path / "base" / "model.safetensors"))
    s = load_settings(None, state_dir=str(tmp_path / "state"))
    return LivePolicy(s, engine=FakeEngine(), base=tmp_path / "base")


def _version(policy, n: int, parent: str) -> WeightsRef:
    v = f"w-{n:06d}"
    path, sha = policy.store.save({"w": torch.full((2,), float(n))}, v, {"parent": parent, "step": n})
    return WeightsRef(version=v, path=str(path), sha256=sha, parent=parent, step=n)


def test_the_pointer_shares_the_gate_engines_weights_only_for_a_version_it_names(tmp_path):
    from policies.weights.shared import SharedChanged

    class Shared:
        writing = False

        def ref(self):
            if self.writing:
                raise SharedChanged("being written")
            return {"version": p.engine.version, "seq": 2, "layout": "l", "owner": 1}

    p = _policy(tmp_path)
    p.engine.shared = Shared()
    r1, r2 = _version(p, 1, "w-000000"), _version(p, 2, "w-000001")
    p.engine.version = "w-000001"  # the gate has just scored it
    assert p.publish_live(r1).shared["version"] == "w-000001"
    assert p.publish_live(r1, canary=r2, share=0.1).shared["version"] == "w-000001"
    assert p.publish_live(r2).shared is None  # it holds another version: replicas read the file
    p.engine.version = "w-000002"
    p.engine.shared.writing = True
    assert p.publish_live(r2).shared is None

    follower = LivePolicy(p.settings, engine=FakeEngine(), base=tmp_path / "base")  # passes the ref on
    calls = []
    follower.engine.load_weights = lambda path, version, shared=None: calls.append((version, shared))
    p.engine.shared.writing = False
    p.publish_live(r2)
    follower.sync()
    assert calls == [("w-000002", {"version": "w-000002", "seq": 2, "layout": "l", "owner": 1})]


def test_follows_live_then_a_published_version_until_its_branch_is_rejected(tmp_path):
    p = _policy(tmp_path)
    assert p.live_version == "w-000000" and p.sync() == "w-000000" and p.engine.loads == []
    r1 = _version(p, 1, "w-000000")
    ptr = p.publish_live(r1)
    assert ptr.version == "w-000001" and ptr.stat is not None  # the verified file's stat is pinned
    assert p.sync() == "w-000001"
    r2, r3 = _version(p, 2, "w-000001"), _version(p, 3, "w-000002")
    p.aim(r3)
    assert p.follow() == "w-000003"
    assert p.descends_from("w-000003", "w-000001") and not p.descends_from("w-000001", "w-000003")
    assert not p.drop_branch("w-000009")  # unrelated: the target stays
    assert p.drop_branch(r2.version) and p.target is None  # w-000003 descends from the rejected w-000002
    assert p.follow() == "w-000001"  # back to live
    assert p.file("w-000000") == tmp_path / "base" / "model.safetensors"


def test_a_canary_is_part_of_the_pointer(tmp_path):
    p = _policy(tmp_path)
    r1 = _version(p, 1, "w-000000")
    base = WeightsRef(version="w-000000", path=str(p.file("w-000000")), sha256="", parent="", step=0)
    ptr = p.publish_live(base, canary=r1, share=0.25)
    assert ptr.canary.version == "w-000001" and ptr.canary.share == 0.25 and ptr.canary.stat is not None
    assert p.pointer() == ptr


def test_the_broadcaster_rewrites_a_pointer_that_ran_ahead_of_the_lifecycle(tmp_path):
    """A crash between writing LIVE and publishing the status event: on start the pointer is rewritten
    from the lifecycle (which is what the stream says)."""
    from actors.broadcaster import Broadcaster

    p = _policy(tmp_path)
    r1, r2 = _version(p, 1, "w-000000"), _version(p, 2, "w-000001")
    b = Broadcaster(p.settings, bus=object())
    b.policy, b.store, b.base_path = p, p.store, p.base
    b.book = PromotionBook(
        tmp_path / "state.json", {"w-000000": S.RETIRED, "w-000001": S.LIVE, "w-000002": S.EVALUATING}, ["w-000000", "w-000001"]
    )
    p.publish_live(r2)  # written, then the crash: w-000002 never became live on the stream
    b._repair_pointer()
    assert p.pointer().version == "w-000001" and p.pointer().canary is None
    b.book.status["w-000002"] = S.CANARY
    b.book.canary = Canary(version="w-000002", baseline="w-000001", started=0.0)
    b._repair_pointer()  # the canary is in the lifecycle but not in the pointer: added
    assert p.pointer().version == "w-000001" and p.pointer().canary.version == "w-000002"
    before = p.publish_live(r1, canary=r2, share=0.5)
    b._repair_pointer()  # consistent with the lifecycle: not rewritten
    assert p.pointer() == before


def test_a_version_is_hashed_once_on_its_node(tmp_path, monkeypatch):
    """The learner hashes what it saves; another process of the node (the broadcaster) accepts the file by the stat
    its manifest pins, and hashes it again only when the file changed since. The base is hashed once too."""
    import policies.promotion.book as promotion
    import policies.weights.model_store as model_store

    hashed = []

    def counted(path):
        hashed.append(str(path))
        return model_store.hashlib.sha256(Path(path).read_bytes()).hexdigest()

    p = _policy(tmp_path)
    r1, r2 = _version(p, 1, "w-000000"), _version(p, 2, "w-000001")
    monkeypatch.setattr(model_store, "sha256_file", counted)
    monkeypatch.setattr(promotion, "sha256_file", counted)
    gate = LivePolicy(p.settings, engine=FakeEngine(), base=tmp_path / "base")  # a process of its own: its own store
    assert gate.obtain(r1) == r1 and hashed == []
    assert gate.publish_live(r1).stat == model_store.file_stat(r1.path) and hashed == []
    book = PromotionBook(tmp_path / "book.json", {"w-000000": S.LIVE}, ["w-000000"])
    gate.publish_live(book.ref("w-000000", gate.store, gate.base), canary=r1, share=0.5)
    assert hashed == [str(tmp_path / "base" / "model.safetensors")]  # the base: once, when its ref is made
    Path(r2.path).write_bytes(b"not the weights the learner hashed")
    assert gate.obtain(r2) is None and hashed[-1] == r2.path  # changed since: hashed, and refused
