"""Pure pieces of the actors, without Ray or NATS."""

from actors.events import ChatMessage, Judgement, Sample
from actors.questioner import task_event_id
from policies.judge.stats import score_rollout
from policies.memory.experience import distil
from policies.tasks.curriculum import ordered_pool


def _sample(outcome, signals, calls=()):
    from actors.events import ToolCall

    msgs = [
        ChatMessage(role="system", content="s"),
        ChatMessage(role="user", content="move the file to temp"),
        ChatMessage(role="assistant", tool_calls=[ToolCall(id=str(i), name=c, arguments="{}") for i, c in enumerate(calls)]),
    ]
    return Sample(sample_id="x", messages=msgs, step_indices=[2], step_signals=signals, outcome=outcome)


def test_rollout_score_is_outcome_plus_shaped_step_signal():
    o, labels = score_rollout(_sample(1.0, [1.0, -0.5]))
    assert abs(o - (1.0 + 0.1 * 0.25)) < 1e-9 and labels == ["GOOD", "BAD"]


def test_questioner_pool_order_and_ids_are_stable():
    pool = [f"e{i}" for i in range(10)]
    assert ordered_pool(pool, 0) == ordered_pool(pool, 0) != ordered_pool(pool, 1)
    assert task_event_id("e1", 0) == task_event_id("e1", 0) != task_event_id("e1", 1)


def test_distil_gives_success_and_failure_with_stable_ids():
    j = Judgement(
        group_id="g",
        source="rollout",
        task_id="t",
        samples=[_sample(1.0, [1.0], ["cd", "mv"]), _sample(0.0, [-1.0])],
        outcomes=[1.0, 0.0],
        step_labels=[["GOOD"], ["BAD"]],
    )
    exps = distil(j)
    assert [e.success for e in exps] == [True, False]
    assert "cd(), mv()" in exps[0].text and "move the file" in exps[0].when
    assert [e.experience_id for e in distil(j)] == [e.experience_id for e in exps]


def test_a_live_answer_made_across_a_weights_swap_is_never_trained_on(tmp_path):
    """Its first tokens came from one version and the rest from the next: no behaviour policy is right."""
    import asyncio
    from types import SimpleNamespace

    from actors.actor import HOLD
    from actors.events import MIXED_WEIGHTS, Judgement, Sample
    from actors.learner import Learner
    from config.settings import load_settings

    s = load_settings(None)
    s.state_dir = str(tmp_path)
    ln = Learner(s, bus=object())
    ln.trainer, ln.held, ln.live, ln.ready = SimpleNamespace(applied=set()), {}, {}, []

    def live(behaviour):
        return Judgement(
            group_id="live:x",
            source="live",
            task_id="live:x",
            samples=[Sample(sample_id="a", messages=[])],
            outcomes=[1.0],
            step_labels=[["GOOD"]],
            behaviour_versions=behaviour,
            origin="live",
        )

    assert asyncio.run(ln.handle_judgement(live([MIXED_WEIGHTS]), object())) is None and ln.live == {}  # acked
    assert asyncio.run(ln.handle_judgement(live([]), object())) is HOLD and len(ln.live["text"]) == 1


def test_rated_live_steps_are_pooled_by_kind_so_one_sided_ratings_of_a_kind_teach_nothing(tmp_path):
    """A scripted user's conversation is a rated tool call (+1 when its output is right) and then a rated answer
    (mostly -1 from a 135M). Pooled in arrival order, each pair taught "call, do not answer"; pooled by kind, two
    wrong answers carry no advantage, and a right and a wrong answer teach the difference."""
    import asyncio
    from types import SimpleNamespace

    from structlog.testing import capture_logs

    from actors.actor import HOLD
    from actors.events import ChatMessage, Judgement, Sample, ToolCall
    from actors.learner import Learner
    from config.settings import load_settings
    from policies.learning.groups import step_credit

    s = load_settings(None)
    s.state_dir = str(tmp_path)
    ln = Learner(s, bus=object())
    ln.trainer, ln.held, ln.live, ln.ready, ln.applied = SimpleNamespace(applied=set(), version="w-9"), {}, {}, [], set()
    ln._fresh = lambda v: v != "w-old"  # the store's lineage is not what this test is about
    acked = []

    class Msg:
        def __init__(self, i):
            self.i = i

        async def ack_sync(self):
            acked.append(self.i)

    def rated(i, call, score, version="w-1"):
        step = (
            ChatMessage(role="assistant", tool_calls=[ToolCall(id="c", name="python", arguments="{}")])
            if call
            else ChatMessage(role="assistant", content="The answer is 7.")
        )
        smp = Sample(sample_id=f"s{i}", messages=[ChatMessage(role="user", content="q"), step], step_indices=[1])
        return Judgement(
            event_id=f"e{i}",
            group_id=f"live:{i}",
            source="live",
            task_id=f"live:{i}",
            samples=[smp],
            outcomes=[score],
            step_labels=[["GOOD" if score > 0 else "BAD"]],
            behaviour_versions=[version],
            origin="live",
        )

    handle = lambda j: asyncio.run(ln.handle_judgement(j, Msg(j.event_id)))  # noqa: E731
    with capture_logs() as logs:
        for j in [rated(1, True, 1.0), rated(2, False, -1.0), rated(3, True, -1.0), rated(4, False, -1.0)]:
            assert handle(j) is HOLD
    # the pool acked untrained says so, with its outcomes (a rated hour's logs show where ratings went)
    assert [x["outcomes"] for x in logs if x["event"] == "live.pool_no_signal"] == [[-1.0, -1.0]]
    # calls (+1, -1) formed an informative group; the two wrong answers formed one with no advantage: acked untrained
    assert [[s.sample_id for s in g.samples] for g in ln.ready] == [["s1", "s3"]]
    assert sorted(acked) == ["e2", "e4"] and ln.live == {"call": [], "text": []}
    handle(rated(5, False, 1.0))
    handle(rated(6, False, -1.0))
    assert [[s.sample_id for s in g.samples] for g in ln.ready][-1] == ["s5", "s6"]
    # a held step gone too stale to train is acked when the next arrives, which waits for a fresh partner instead
    handle(rated(7, False, 1.0, version="w-old"))
    with capture_logs() as logs:
        handle(rated(8, False, -1.0))
    assert [x["dropped"] for x in logs if x["event"] == "live.pool_stale"] == [["live:7"]] and "e7" in acked
    assert [x.event_id for x in ln.live["text"]] == ["e8"]
    # each rated step trained alone by its own rating: ready at once, a -1 included (hand-computed: advantage -1)
    ln.settings.learner.pooled_advantage, ln.settings.learner.min_live_group = "outcome", 1
    handle(rated(9, True, -1.0))
    assert [s.sample_id for s in ln.ready[-1].samples] == ["s9"] and step_credit(ln.ready[-1], 0.1) == [[-1.0]]


def test_the_learner_always_trains_from_a_version_users_get_or_will_get(tmp_path):
    """A 60-minute run lost its last 37 minutes this way: a successor of the canary was rejected, the learner
    went back to live (the canary's parent), then the canary went live; every group sampled with it was
    'stale' for a learner on its parent, and nothing reset the learner again."""
    import asyncio
    from types import SimpleNamespace

    import torch

    from actors.events import WeightsPromoted, WeightsRef, WeightsRejected
    from actors.learner import Learner
    from actors.lifecycles import CanaryRef
    from config.settings import load_settings
    from policies.engines.live_policy import LivePolicy
    from policies.learning.step_size import StepSize

    s = load_settings(None, state_dir=str(tmp_path / "state"))
    (tmp_path / "base").mkdir()
    ln = Learner(s, bus=object())
    ln.policy = LivePolicy(s, base=tmp_path / "base")
    ln.store = ln.policy.store
    refs = {}
    for n, parent in ((1, "w-000000"), (2, "w-000001"), (3, "w-000002"), (4, "w-000001")):
        v = f"w-{n:06d}"
        path, sha = ln.store.save({"w": torch.full((2,), float(n))}, v, {"parent": parent, "step": n})
        refs[v] = WeightsRef(version=v, path=str(path), sha256=sha, parent=parent, step=n)
    resets = []
    ln.trainer = SimpleNamespace(version="w-000003", lr=1e-5, reference_version="w-000000")
    ln.trainer.reset_to = lambda path, version: (resets.append(version), setattr(ln.trainer, "version", version))
    ln.trainer.set_lr = lambda lr: setattr(ln.trainer, "lr", lr)
    ln.step_size = StepSize.from_settings(s.learner.model_copy(update={"kl_target": 0.1, "lr_min": 2e-6}))

    def reject(v):
        asyncio.run(
            ln.handle_weights_rejected(WeightsRejected(weights=refs[v], candidate_score=0, live_score=0, reason="r"), None)
        )

    def live(v):
        asyncio.run(
            ln.handle_weights_promoted(
                WeightsPromoted(weights=refs[v], candidate_score=0, live_score=0, previous="", stage="live"), None
            )
        )

    r1, r2 = refs["w-000001"], refs["w-000002"]
    ln.store.set_live("w-000001", r1.path, r1.sha256, canary=CanaryRef(version="w-000002", path=r2.path, share=0.1))
    reject("w-000003")  # its parent is the canary: train on from there, not from live
    assert resets == ["w-000002"]
    assert ln.trainer.lr == 5e-6  # a rejected step: the step size is halved (learner.kl_target set)
    live("w-000002")  # the canary went live: the learner is on it already
    assert resets == ["w-000002"]
    ln.trainer.version = "w-000003"
    ln.store.set_live("w-000002", r2.path, r2.sha256)
    reject("w-000003")  # no canary: live
    assert resets == ["w-000002", "w-000002"]
    live("w-000004")  # an operator forced a sibling branch live: follow it
    assert resets[-1] == "w-000004" and ln.trainer.version == "w-000004"
    assert ln.trainer.lr == 2.5e-6
    reject("w-000002")  # not an ancestor of what it trains: nothing to do
    assert len(resets) == 3 and ln.trainer.lr == 2.5e-6
