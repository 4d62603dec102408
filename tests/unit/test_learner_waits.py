"""The learner does not run ahead of what users are answered with: while live samples are held, it steps at most
`max(1, learner.max_staleness)` versions past the live (or canary) one, then waits for the broadcaster, at most
`learner.max_wait_s` (the second GPU `up` published 5 versions in 40 s while the gate decided none, and every live
group after that was dropped as stale). Without live samples it steps on as before; live groups at their last
chance are trained first."""

import asyncio
import time
from types import SimpleNamespace

from learner_harness import Msg, make_learner  # tests/ is on sys.path
from sample_groups import lineage_store, two_sample_group

from actors.events import LearnerStep
from actors.lifecycles import CanaryRef
from policies.learning.groups import behaviour_of, step_choice
from policies.learning.staleness import WaitForUsers, lead_over_users


def test_the_lead_counts_only_from_the_bound_and_only_along_the_lineage(tmp_path):
    store = lineage_store(tmp_path)  # w-1..w-6 in a line, w-7 trained from w-3 after w-4..w-6 were rejected
    assert lead_over_users(store, "w-000004", ["w-000000"], 4) == 4  # 4 past the served base: wait
    assert lead_over_users(store, "w-000003", ["w-000000"], 4) is None  # one more step keeps its samples fresh
    assert lead_over_users(store, "w-000006", ["w-000000"], 4) == 6  # already past: still wait, never further
    assert lead_over_users(store, "w-000006", ["w-000000", "w-000004"], 4) is None  # a canary w-4: 2 past it
    assert lead_over_users(store, "w-000007", ["w-000005"], 4) is None  # another branch: waiting would not help
    assert lead_over_users(store, "w-000001", ["w-000000"], 0) == 1  # strictly on-policy: one step, then wait
    assert lead_over_users(store, "w-000000", ["w-000000"], 0) is None
    wait, base = WaitForUsers(max_wait_s=60), store.make_live("w-000000", None, None)
    assert wait(store, "w-000004", base, 4, True, 0.0) == "waiting"
    assert wait(store, "w-000004", base, 4, True, 59.0) == "still"
    assert wait(store, "w-000004", base, 4, True, 61.0) == "expired"  # the gate never decided: step anyway
    assert wait(store, "w-000004", base, 4, False, 62.0) is None  # no users active: no wait
    assert wait(store, "w-000005", base, 4, True, 70.0) == "waiting" and wait.key == ("w-000005", "w-000000")
    canary = CanaryRef(version="w-000004", path=None, sha256=None, share=0.25)
    assert wait(store, "w-000006", base.model_copy(update={"canary": canary}), 4, True, 71.0) is None  # 2 past the canary
    live = WaitForUsers.from_settings(SimpleNamespace(max_wait_s=60, wait_for="live"))  # most users get live's answers
    assert live(store, "w-000006", base.model_copy(update={"canary": canary}), 4, True, 72.0) == "waiting"  # 6 past it
    assert live.key == ("w-000006", "w-000000")
    assert live(store, "w-000003", base.model_copy(update={"canary": canary}), 4, True, 73.0) is None  # 3 past it


def _live(i: int, version: str):
    j = two_sample_group(i, version).model_copy(update={"source": "live"})
    return j.model_copy(update={"source_event_ids": [j.event_id], "behaviour_versions": behaviour_of(j)})


def _serve(ln, version: str) -> None:
    ln.store.set_live(version, str(ln.store.file(version)), None)


def _steps(ln) -> list[LearnerStep]:
    return [e for e in ln.bus.events if isinstance(e, LearnerStep)]


def test_with_live_groups_held_the_learner_waits_for_serving_and_trains_them_once_it_moves(tmp_path, tiny_dir):
    ln = make_learner(tmp_path, tiny_dir, max_staleness=1)
    asyncio.run(ln.handle_judgement(two_sample_group(1), Msg()))
    asyncio.run(ln.tick())
    assert ln.trainer.version == "w-000001" and ln.policy.live_version == "w-000000"  # one past the served base
    ln.ready.append(_live(2, "w-000000"))  # users are answered by the base
    ln.held["j-2"] = Msg()
    asyncio.run(ln.handle_judgement(two_sample_group(3, "w-000001"), Msg()))
    for _ in range(3):
        asyncio.run(ln.tick())
    assert len(_steps(ln)) == 1 and len(ln.ready) == 2 and ln.dropped_stale == 0  # waits; loses nothing
    _serve(ln, "w-000001")  # the broadcaster promoted it: the pointer moves before its event
    asyncio.run(ln.tick())
    asyncio.run(ln.tick())
    assert len(_steps(ln)) == 3 and ln.dropped_stale == 0 and ln.held == {}  # both trained: one step behind is fresh
    assert sorted(i for s in _steps(ln)[1:] for i in s.source_event_ids) == ["j-2", "j-3"]


def test_without_live_groups_the_learner_steps_on(tmp_path, tiny_dir):
    ln = make_learner(tmp_path, tiny_dir, max_staleness=1)
    for i in range(1, 4):
        asyncio.run(ln.handle_judgement(two_sample_group(i, ln.trainer.version), Msg()))
        asyncio.run(ln.tick())
    assert len(_steps(ln)) == 3 and ln.trainer.version == "w-000003" and ln.policy.live_version == "w-000000"


def test_a_pending_rating_counts_and_the_wait_ends_after_max_wait_s(tmp_path, tiny_dir):
    ln = make_learner(tmp_path, tiny_dir, max_staleness=1, max_wait_s=0.5)
    asyncio.run(ln.handle_judgement(two_sample_group(1), Msg()))
    asyncio.run(ln.tick())
    ln.live["call"] = [_live(2, "w-000000")]  # one rating waits for a second to make a group
    asyncio.run(ln.handle_judgement(two_sample_group(3, "w-000001"), Msg()))
    asyncio.run(ln.tick())
    assert len(_steps(ln)) == 1  # a user is active: no step past the bound
    time.sleep(0.6)
    asyncio.run(ln.tick())
    assert len(_steps(ln)) == 2  # the gate did not decide within max_wait_s: one step, then the wait starts again


def test_live_groups_at_their_last_chance_go_first_then_the_newest():
    age = {"w-000000": 2, "w-000001": 1, "w-000002": 0}  # learner steps behind the weights being trained
    old_live, rollout, new_live, newest = _live(1, "w-000000"), _live(2, "w-000002"), _live(3, "w-000001"), _live(4, "w-000002")
    rollout = rollout.model_copy(update={"source": "rollout"})
    newest = newest.model_copy(update={"source": "rollout"})
    ready = [old_live, rollout, new_live, newest]
    pick = step_choice(ready, 2, 8, age.get, 2)
    assert [g.group_id for g in pick] == ["g1", "g4"]  # the live group about to go stale, then the newest
    assert [g.group_id for g in step_choice(ready, 2, 8, age.get, 3)] == ["g3", "g4"]  # none at the edge: newest first
    assert [g.group_id for g in step_choice(ready, 1, 8, age.get, 2)] == ["g1"]


def test_groups_dropped_as_stale_are_counted_by_source_and_reported_with_the_next_step(tmp_path, tiny_dir):
    ln = make_learner(tmp_path, tiny_dir, max_staleness=1)
    for i in (1, 2):
        asyncio.run(ln.handle_judgement(two_sample_group(i, ln.trainer.version), Msg()))
        asyncio.run(ln.tick())
    assert ln.trainer.version == "w-000002"
    ln.ready.append(_live(3, "w-000000"))  # a user's step two versions behind: stale
    ln.held["j-3"] = Msg()
    ln.ready.append(two_sample_group(4, "w-000000"))  # practice as stale
    asyncio.run(ln.handle_judgement(two_sample_group(5, "w-000002"), Msg()))
    asyncio.run(ln.tick())
    assert (ln.dropped_stale, ln.dropped_stale_live) == (2, 1) and "j-3" not in ln.held  # acked: nothing redelivered
    step = _steps(ln)[-1]
    assert step.source_event_ids == ["j-5"]
    assert (step.metrics["dropped_stale_groups"], step.metrics["dropped_stale_live"]) == (2.0, 1.0)
