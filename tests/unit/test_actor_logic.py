"""Pure pieces of the actors, without Ray or NATS."""
from actors.attributor import score_rollout
from actors.events import ChatMessage, Judgement, Sample
from policies.experience import distil
from actors.questioner import task_event_id
from policies.curriculum import ordered_pool


def _sample(outcome, signals, calls=()):
    from actors.events import ToolCall
    msgs = [ChatMessage(role="system", content="s"), ChatMessage(role="user", content="move the file to temp"),
            ChatMessage(role="assistant", tool_calls=[ToolCall(id=str(i), name=c, arguments="{}") for i, c in enumerate(calls)])]
    return Sample(sample_id="x", messages=msgs, step_indices=[2], step_signals=signals, outcome=outcome)


def test_rollout_score_is_outcome_plus_shaped_step_signal():
    o, labels = score_rollout(_sample(1.0, [1.0, -0.5]))
    assert abs(o - (1.0 + 0.1 * 0.25)) < 1e-9 and labels == ["GOOD", "BAD"]


def test_questioner_pool_order_and_ids_are_stable():
    pool = [f"e{i}" for i in range(10)]
    assert ordered_pool(pool, 0) == ordered_pool(pool, 0) != ordered_pool(pool, 1)
    assert task_event_id("e1", 0) == task_event_id("e1", 0) != task_event_id("e1", 1)


def test_distil_gives_success_and_failure_with_stable_ids():
    j = Judgement(group_id="g", source="rollout", task_id="t", samples=[_sample(1.0, [1.0], ["cd", "mv"]), _sample(0.0, [-1.0])],
                  outcomes=[1.0, 0.0], step_labels=[["GOOD"], ["BAD"]])
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
    ln.trainer, ln.held, ln.live, ln.ready = SimpleNamespace(applied=set()), {}, [], []

    def live(behaviour):
        return Judgement(group_id="live:x", source="live", task_id="live:x", samples=[Sample(sample_id="a", messages=[])],
                         outcomes=[1.0], step_labels=[["GOOD"]], behaviour_versions=behaviour, origin="live")
    assert asyncio.run(ln.handle_judgement(live([MIXED_WEIGHTS]), object())) is None and ln.live == []  # acked
    assert asyncio.run(ln.handle_judgement(live([]), object())) is HOLD and len(ln.live) == 1
