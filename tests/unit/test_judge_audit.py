"""`judge.audit_share`: with `judge.step_labels: verified`, a rollout group whose every step the environment labels is
judged only to measure agreement, so only that share of such groups (by group id) goes to the judge. The attributor
with a bus double and a judge that counts its calls."""

import asyncio
from types import SimpleNamespace

import pytest
from learner_harness import Msg  # tests/ is on sys.path
from live_doubles import ASK, WEATHER, answer

from actors.events import ChatMessage, Judgement, Sample
from actors.task_events import Rollout, Task
from policies.judge.judge import Agreement, Verdict, audited


def test_the_audit_is_decided_by_the_group_id_alone():
    ids = [f"group-{i}" for i in range(4000)]
    assert all(audited(g, 1.0) for g in ids) and not any(audited(g, 0.0) for g in ids)
    tenth = [g for g in ids if audited(g, 0.1)]
    assert 340 < len(tenth) < 460  # 400 expected; sd 19
    assert tenth == [g for g in ids if audited(g, 0.1)]  # a redelivered group is decided the same way
    assert set(tenth) <= {g for g in ids if audited(g, 0.5)}  # a larger share audits every group a smaller one did


class _Bus:
    def __init__(self):
        self.events = []

    async def publish(self, ev, weights_version=None):
        self.events.append(ev)


def _sample(signals) -> Sample:
    msgs = [ChatMessage(role="user", content=ASK), answer({"city": "Oslo"})]
    return Sample(sample_id="s", messages=msgs, tools=[WEATHER], step_indices=[1] if signals else [], step_signals=signals)


def _judge(tmp_path, share, labels="verified"):
    from actors.attributor import Attributor
    from config.settings import load_settings

    s = load_settings(None)
    s.state_dir, s.judge.audit_share, s.judge.step_labels = str(tmp_path), share, labels
    a = Attributor(s, bus=_Bus())
    a.agreement = Agreement()
    a.stats = dict.fromkeys(("judged", "fallback_budget", "fallback_error", "fallback_malformed", "screened", "unaudited"), 0)
    a.calls, a.judge = 0, SimpleNamespace(name="policy")

    async def judge(samples, references):
        a.calls += 1
        return [Verdict(labels=["BAD"] * len(s.step_indices), score=10.0, judge="policy") for s in samples]

    a.run_judge = judge
    return a


def _group(a, group_id, signals):
    task = Task(task_id="t", env="bfcl_single", entry_id="simple_python_1")
    asyncio.run(a.handle_rollout(Rollout(task=task, group_id=group_id, samples=[_sample(x) for x in signals]), Msg()))
    (j,) = a.bus.events[-1:]
    assert isinstance(j, Judgement)
    return j


@pytest.mark.parametrize("share,judged", [(1.0, True), (0.0, False)])
def test_a_group_the_environment_labels_goes_to_the_judge_only_when_audited(tmp_path, share, judged):
    a = _judge(tmp_path, share)
    j = _group(a, "g1", [[1.0], [-0.5]])
    assert a.calls == int(judged)
    assert j.step_labels == [["GOOD"], ["BAD"]]  # the environment's labels train either way
    assert j.judge == ("policy" if judged else "env") and (j.judge_labels is not None) is judged
    assert a.stats["unaudited"] == (0 if judged else 2)


def test_a_group_with_a_step_the_environment_cannot_label_or_judge_labels_is_always_judged(tmp_path):
    a = _judge(tmp_path, 0.0)
    _group(a, "g1", [[1.0], []])  # a sample with no step signal: the judge's labels are the only ones it has
    b = _judge(tmp_path, 0.0, labels="judge")
    j = _group(b, "g2", [[1.0], [-0.5]])
    assert a.calls == 1 and b.calls == 1 and j.step_labels == [["BAD"], ["BAD"]]
