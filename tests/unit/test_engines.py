"""A replica's engines (live, canary, role swap, routing), with stand-in engines."""

import pytest
import torch

from actors.lifecycles import LivePointer
from policies.weights.model_store import BASE_VERSION, sha256_file
from serve.weights import EngineSet


class FakeEngine:
    made = 0

    def __init__(self, version="w-000000"):
        self.version, self.loads = version, []
        FakeEngine.made += 1

    def load_weights(self, path, version):
        self.loads.append(version)
        self.version = version
        return 1.0


def _set(live, make_canary, tmp_path):
    """An engine set whose base version's file is tmp_path/model.safetensors (as LivePolicy.file resolves it)."""

    def file(version, path):
        return path or (str(tmp_path / "model.safetensors") if version == BASE_VERSION else None)

    return EngineSet(live, make_canary, file)


def P(d: dict) -> LivePointer:
    return LivePointer.model_validate(d)


def _ref(tmp_path, version, **extra):
    p = tmp_path / f"{version}.safetensors"
    p.write_bytes(version.encode())
    return {"version": version, "path": str(p), "sha256": sha256_file(p), **extra}


def test_engine_set_follows_the_live_pointer(tmp_path):
    FakeEngine.made = 0
    es = _set(FakeEngine(), FakeEngine, tmp_path)
    live = es.live
    assert es.sync(P({"version": "w-000000", "canary": None})) == []
    v1 = _ref(tmp_path, "w-000001")
    assert es.sync(P({**_ref(tmp_path, "w-000000"), "canary": {**v1, "share": 0.25}})) == ["canary"]
    assert es.canary.version == "w-000001" and es.live is live and FakeEngine.made == 2
    picks = [es.pick(f"chatcmpl-{i}") for i in range(2000)]
    share = sum(p is es.canary for p in picks) / len(picks)
    assert 0.2 < share < 0.3 and es.pick("chatcmpl-7") is es.pick("chatcmpl-7")  # stable per interaction
    canary = es.canary
    assert es.sync(P({**v1, "canary": None})) == ["promoted"]  # the canary went live: roles swap, nothing loads
    assert es.live is canary and es.canary is None and es.spare is live and canary.loads == ["w-000001"]
    assert es.pick("x") is es.live
    v2 = _ref(tmp_path, "w-000002")
    assert es.sync(P({**v1, "canary": {**v2, "share": 0.5}})) == ["canary"]
    assert es.canary is live and FakeEngine.made == 2  # the spare is reused
    assert es.sync(P({**v1, "canary": None})) == ["canary_ended"]  # rolled back: the canary is set aside
    assert es.canary is None and es.spare is live
    v3 = _ref(tmp_path, "w-000003")
    assert es.sync(P({**v3, "canary": None})) == ["live"] and es.live.loads[-1] == "w-000003"  # in place


def test_a_canary_on_another_kind_of_engine_goes_live_in_the_live_engine(tmp_path):
    """On a GPU replica the canary is a transformers engine beside vLLM: when it goes live, users must stay
    on vLLM (loaded in place), not be handed to the canary's engine."""

    class VllmLike(FakeEngine):
        pass

    es = _set(VllmLike(), FakeEngine, tmp_path)
    live = es.live
    v1 = _ref(tmp_path, "w-000001")
    es.sync(P({**_ref(tmp_path, "w-000000"), "canary": {**v1, "share": 0.1}}))
    canary = es.canary
    assert es.sync(P({**v1, "canary": None})) == ["live", "canary_ended"]
    assert es.live is live and live.version == "w-000001" and es.spare is canary and es.canary is None


def test_a_swap_checks_the_pinned_stat_not_the_hash(tmp_path, monkeypatch):
    """The broadcaster hashes a version once (staging); the pointer pins size and mtime; replicas stat."""
    import os

    import serve.weights as engines
    from policies.weights.model_store import WeightsStore

    store = WeightsStore(tmp_path)
    path, digest = store.save({"w": torch.ones(2)}, "w-000001")
    assert store.verify(path, digest)
    store.set_live("w-000001", str(path), digest)
    pointer = store.live()
    assert pointer.stat == [os.stat(path).st_size, os.stat(path).st_mtime_ns]
    monkeypatch.setattr(engines, "sha256_file", lambda p: pytest.fail("a replica re-hashed the file"))
    es = _set(FakeEngine(), FakeEngine, tmp_path)
    assert es.sync(pointer) == ["live"] and es.live.version == "w-000001"
    os.utime(path, ns=(1, 1))  # the file changed after it was verified
    es2 = _set(FakeEngine(), FakeEngine, tmp_path)
    assert es2.sync(pointer) == [] and es2.live.version == "w-000000"


def test_engine_set_refuses_a_file_that_does_not_match(tmp_path):
    es = _set(FakeEngine(), FakeEngine, tmp_path)
    bad = {**_ref(tmp_path, "w-000001"), "sha256": "0" * 64}
    assert es.sync(P({**bad, "canary": None})) == [] and es.live.version == "w-000000"
    assert es.sync(P({"version": "w-000002", "path": str(tmp_path / "missing"), "sha256": None, "canary": None})) == []


def test_a_version_the_pointer_shares_is_copied_from_memory_and_others_from_the_file(tmp_path):
    class Sharing(FakeEngine):
        def load_weights(self, path, version, shared=None):
            self.loads.append((version, shared and shared["version"]))
            self.version, self.last_load = version, "shared" if shared else "file"
            return 1.0

    es = _set(Sharing(), Sharing, tmp_path)
    v1, v2 = _ref(tmp_path, "w-000001"), _ref(tmp_path, "w-000002")
    ref = {"version": "w-000001", "seq": 2, "layout": "x", "owner": 1}
    es.sync(P({**v1, "canary": None, "shared": ref}))
    assert es.live.loads == [("w-000001", "w-000001")] and es.via == "shared"
    es.sync(P({**v1, "canary": {**v2, "share": 0.5}, "shared": ref}))  # the ref names live, not the canary
    assert es.canary.loads == [("w-000002", None)] and es.via == "file"
