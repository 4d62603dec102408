"""Learner checkpoints: the manifest is the commit point, sha256 is checked, the previous one is the fallback."""

import json

import torch

from policies.learning.checkpoint import MANIFEST, PREVIOUS, CheckpointStore


def _state(step):
    return {"model": {"w": torch.full((4,), float(step))}, "step": step, "applied": [f"j{step}"]}


def test_roundtrip_keeps_the_last_two(tmp_path):
    ck = CheckpointStore(tmp_path)
    assert ck.load() is None
    for step in (1, 2, 3):
        man = ck.save(_state(step), step, f"w-{step:06d}")
        assert man["step"] == step and len(man["sha256"]) == 64
    state, man, skipped = ck.load()
    assert state["step"] == 3 and man["version"] == "w-000003" and skipped == []
    assert sorted(p.name for p in tmp_path.glob("ckpt-*.pt")) == ["ckpt-000002.pt", "ckpt-000003.pt"]
    assert json.loads((tmp_path / PREVIOUS).read_text())["step"] == 2


def test_a_newest_checkpoint_that_does_not_verify_falls_back(tmp_path):
    ck = CheckpointStore(tmp_path)
    ck.save(_state(1), 1, "w-000001")
    ck.save(_state(2), 2, "w-000002")
    newest = tmp_path / "ckpt-000002.pt"
    newest.write_bytes(newest.read_bytes()[:100])  # a torn write
    state, man, skipped = ck.load()
    assert state["step"] == 1 and man["step"] == 1 and "sha256 does not match" in skipped[0]
    newest.unlink()
    state, _, skipped = ck.load()
    assert state["step"] == 1 and "missing" in skipped[0]


def test_a_save_cut_off_before_its_manifest_leaves_the_previous_one(tmp_path):
    ck = CheckpointStore(tmp_path)
    ck.save(_state(1), 1, "w-000001")
    (tmp_path / ".ckpt-000002.pt.tmp").write_bytes(b"partial")  # killed while writing
    (tmp_path / "ckpt-000002.pt").write_bytes(b"renamed, but no manifest yet")  # killed before the manifest
    state, man, _ = ck.load()
    assert state["step"] == 1 and man["file"] == "ckpt-000001.pt"
    ck.save(_state(2), 2, "w-000002")  # the next save removes what no manifest names
    assert not (tmp_path / ".ckpt-000002.pt.tmp").exists()
    assert ck.load()[0]["step"] == 2 and json.loads((tmp_path / MANIFEST).read_text())["step"] == 2


def test_a_checkpoint_keeps_the_judgement_ids_of_recent_steps_only():
    from policies.learning.checkpoint import APPLIED_STEPS, applied_ids

    applied = {}
    for step in range(1, APPLIED_STEPS + 3):
        applied = applied_ids(applied, step, [f"j{step}a", f"j{step}b"])
    # only a step cut off between its checkpoint and its acks is redelivered: older ids need not stay in every checkpoint
    assert len(applied) == 2 * APPLIED_STEPS and "j2b" not in applied and "j3a" in applied
    assert applied[f"j{APPLIED_STEPS + 2}b"] == APPLIED_STEPS + 2 and f"j{APPLIED_STEPS + 2}a" in applied
    assert applied_ids(["j7", "j8"], 9) == {"j7": 9, "j8": 9}  # an older checkpoint's list: read as its step's


def test_an_actors_applied_ids_outlive_the_stream_and_no_longer(tmp_path, monkeypatch):
    import time

    from actors.actor import AppliedIds

    ids = AppliedIds(tmp_path / "a.db", keep_s=100.0)
    ids.add("old")
    monkeypatch.setattr(time, "time", lambda: 1e12)  # past the stream's max_age: its event can never come back
    ids.add("new")
    assert "old" in ids  # pruned at open and every PRUNE_EVERY adds, not on every add
    ids.prune()
    assert "old" not in ids and "new" in ids
    ids.add("again")
    reopened = AppliedIds(tmp_path / "a.db", keep_s=0.0)  # max_age 0: the stream keeps every event, so do we
    assert "new" in reopened and "again" in reopened


def test_a_judgement_whose_ack_failed_is_still_known_as_applied(tmp_path):
    import asyncio

    import pytest

    from actors.learner import Learner
    from config.settings import load_settings

    s = load_settings(None)
    s.state_dir = str(tmp_path)
    ln = Learner(s, bus=object())

    class Lost:
        async def ack_sync(self):
            raise TimeoutError("ack lost")

    ln.held = {"j1": Lost()}
    with pytest.raises(TimeoutError):
        asyncio.run(ln._ack(["j1"]))
    assert "j1" in ln.applied  # its redelivery is acked, not trained again, however many steps later it comes
