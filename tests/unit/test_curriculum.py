"""The ladder: the questioner issues dataset tasks from the lowest rung the policy has not mastered."""

import pytest

from policies.tasks.curriculum import Ladder


def test_rung_climbs_after_mastery_and_falls_back_when_forgotten():
    lad = Ladder(window=4, min_groups=2, mastery=0.8)
    assert lad.rung("code", [0, 1, 2]) == 0
    lad.record("code", 0, [1.0, 1.0, 1.0, 1.0])
    assert lad.rung("code", [0, 1, 2]) == 0  # one group is not enough evidence
    lad.record("code", 0, [1.0, 1.0, 1.0, 0.0])  # rates 1.0, 0.75 -> mean 0.875
    assert lad.mastered("code", 0) and lad.rung("code", [0, 1, 2]) == 1
    lad.record("code", 0, [0.0] * 4)
    lad.record("code", 0, [0.0] * 4)  # rates 1, .75, 0, 0 -> 0.44: fell below mastery
    assert lad.rung("code", [0, 1, 2]) == 0
    for _ in range(4):
        lad.record("code", 0, [1.0])
    assert lad.recent["code"]["0"] == [1.0] * 4  # only the last `window` groups count


def test_ladder_state_round_trips_and_summarises():
    lad = Ladder(window=3, min_groups=1, mastery=0.5)
    lad.record("code", 0, [1.0, 0.0])
    lad.record("code", 1, [0.0, 0.0])
    again = Ladder(window=3, min_groups=1, mastery=0.5, state=lad.state())
    assert again.summary({"code": [0, 1, 2], "bfcl": [0]}) == {
        "code": {"rung": 1, "success": {0: 0.5, 1: 0.0}},
        "bfcl": {"rung": 0, "success": {}},
    }
    assert again.rung("code", [0]) == 0  # all mastered: stay on the top rung


def test_schedule_spreads_turns_by_weight():
    from policies.tasks.curriculum import schedule

    assert schedule(["bfcl", "code"], {}) == ["bfcl", "code"]
    turns = schedule(["bfcl", "code"], {"code": 3})
    assert sorted(turns) == ["bfcl", "code", "code", "code"] and turns[0] == "code"
    assert schedule(["a", "b", "c"], {"a": 2, "c": 0}) == ["a", "b", "a"]
    with pytest.raises(ValueError):
        schedule(["a"], {"a": 0})
