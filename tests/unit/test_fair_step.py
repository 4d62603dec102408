"""One user's burst of live traffic cannot fill a learner step while other users' live groups wait
(policies/learning/groups.fair_step); a user alone, or rollouts alone, train as before (the newest groups first)."""

from actors.events import Judgement, Sample
from policies.learning.groups import fair_step, step_choice


def _g(name: str, user: str | None = None) -> Judgement:
    live = user is not None
    return Judgement(
        group_id=name,
        source="live" if live else "rollout",
        task_id=name,
        samples=[Sample(sample_id=f"{name}{i}", messages=[]) for i in range(2)],
        outcomes=[1.0, 0.0],
        step_labels=[[], []],
        user_hashes=[user, user] if live else [],
    )


def _names(groups):
    return [g.group_id for g in groups]


def test_a_burst_of_one_user_leaves_room_for_the_others():
    ready = [_g("b1", "bob"), _g("a1", "ann"), _g("a2", "ann"), _g("a3", "ann")]
    assert _names(fair_step(ready, 2, per_user=1)) == ["b1", "a3"]  # not a2 + a3, the newest two
    assert _names(fair_step(ready, 3, per_user=1)) == ["b1", "a2", "a3"]  # not enough others: the newest passed over


def test_alone_or_with_rollouts_the_newest_groups_train_as_before():
    alone = [_g("a1", "ann"), _g("a2", "ann"), _g("a3", "ann")]
    assert _names(fair_step(alone, 2, per_user=1)) == ["a2", "a3"]
    mixed = [_g("e1"), _g("a1", "ann"), _g("e2"), _g("a2", "ann")]
    assert _names(fair_step(mixed, 2, per_user=1)) == ["e2", "a2"]
    assert _names(fair_step([_g("e1"), _g("e2"), _g("e3")], 2, per_user=1)) == ["e2", "e3"]


def _at(name: str, user: str, version: str) -> Judgement:
    return _g(name, user).model_copy(update={"behaviour_versions": [version, version]})


AGE = {"old": 2, "new": 0}.get  # learner steps behind: "old" is at its last chance with max_staleness 2


def test_a_burst_at_its_last_chance_gets_no_more_room_than_any_other():
    ready = [_at("b1", "bob", "new"), _at("a1", "ann", "old"), _at("a2", "ann", "old"), _at("a3", "ann", "old")]
    assert _names(step_choice(ready, 3, 1, AGE, 2)) == ["b1", "a2", "a3"]  # not a1 + a2 + a3 while bob's group waits
    assert _names(step_choice(ready, 2, 1, AGE, 2)) == ["b1", "a3"]


def test_one_count_per_user_over_the_last_chances_and_the_rest():
    ready = [_at("b1", "bob", "new"), _at("a1", "ann", "old"), _at("a2", "ann", "new")]
    assert _names(step_choice(ready, 2, 1, AGE, 2)) == ["b1", "a1"]  # not a1 + a2: ann's count goes on past the edge
    # too few under the cap: the passed-over fill the step, those at their last chance (else lost) before the newest
    ready = [_at("a0", "ann", "new"), _at("b1", "bob", "new"), _at("a1", "ann", "old"), _at("a2", "ann", "old")]
    assert _names(step_choice(ready, 3, 1, AGE, 2)) == ["b1", "a1", "a2"]
