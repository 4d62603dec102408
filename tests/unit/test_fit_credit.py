"""`rollout.fit_credit`: in a one-call environment, a rejected call that fits the declared tools ranks between an
accepted call and a misfit. Hand-written samples, hand-computed outcomes and advantages; the attributor with a bus
double."""

import asyncio
import math

import pytest
from learner_harness import Msg  # tests/ is on sys.path
from live_doubles import ASK, WEATHER, answer

from actors.events import ChatMessage, Judgement, Sample
from actors.task_events import Rollout, Task
from envs.bfcl_single import OneCallEpisode
from envs.tool_fit import calls_fit
from policies.judge.stats import score_rollout
from policies.learning import adca


class _Episode(OneCallEpisode):
    """get_weather(city) asked for Oslo: the checker accepts exactly city=Oslo."""

    def __init__(self):
        super().__init__("e1", ASK, [WEATHER])

    def judge(self, calls):
        ok = calls[0].arguments.replace(" ", "") == '{"city":"Oslo"}'
        return ok, "" if ok else "Invalid value for parameter 'city'"


def _sample(action: ChatMessage) -> Sample:
    """A one-call rollout as `policies/rollout.py` builds it: the episode's signal and outcome."""
    ep = _Episode()
    ep.next_user_message()
    res = ep.step(action)
    msgs = [ChatMessage(role="system", content=ep.system_prompt), ChatMessage(role="user", content=ASK), action]
    return Sample(
        sample_id=str(id(action)),
        messages=msgs,
        tools=[WEATHER],
        step_indices=[2],
        step_signals=[res.signal],
        outcome=ep.outcome(),
    )


ACCEPTED = answer({"city": "Oslo"})
FITS = answer({"city": "Bergen", "days": 3})  # every name and type right, the value wrong
MISFIT = answer({"days": 3})  # the required city left out
NO_CALL = ChatMessage(role="assistant", content="It is sunny.")


@pytest.mark.parametrize(
    "action,fits",
    [
        (ACCEPTED, True),
        (FITS, True),
        (MISFIT, False),
        (answer({"city": "Oslo", "days": "3"}), False),
        (answer({"zone": "CET"}, name="get_time"), False),
        (answer("{not json"), False),
        (NO_CALL, False),
    ],
)
def test_a_call_fits_when_every_step_calls_a_declared_function_with_arguments_its_schema_takes(action, fits):
    assert calls_fit(_sample(action)) is fits


def test_the_credit_goes_only_to_a_rejected_call_that_fits():
    """outcome + 0.1 x step signal (+1 accepted, -0.5 rejected, -1 no call), + 0.3 for the fitting rejected call."""
    got = [score_rollout(_sample(a), 0.3)[0] for a in (ACCEPTED, FITS, MISFIT, NO_CALL)]
    assert got == pytest.approx([1.1, 0.25, -0.05, -0.1])
    assert [score_rollout(_sample(a))[0] for a in (ACCEPTED, FITS, MISFIT, NO_CALL)] == pytest.approx([1.1, -0.05, -0.05, -0.1])


def test_a_group_with_the_credit_has_hand_computed_advantages():
    """Outcomes 1.1, 0.25, -0.05, -0.1: mean 0.3, population std sqrt(0.925 / 4) = 0.480885. Step labels GOOD, BAD,
    BAD, BAD: mean -0.5, variance 0.75, z = 1.732051, -0.577350 x3. A = 0.1 z + u. Without the credit the fitting
    call shares the misfit's advantage (-0.601650); with it, it sits near zero and the misfits carry the loss."""
    outcomes = [score_rollout(_sample(a), 0.3)[0] for a in (ACCEPTED, FITS, MISFIT, NO_CALL)]
    labels = [["GOOD"], ["BAD"], ["BAD"], ["BAD"]]
    std = math.sqrt(0.925 / 4)
    assert std == pytest.approx(0.480885, abs=1e-6)
    z = [1.5 / math.sqrt(0.75), -0.5 / math.sqrt(0.75)]
    want = [0.1 * z[0] + 0.8 / std, 0.1 * z[1] - 0.05 / std, 0.1 * z[1] - 0.35 / std, 0.1 * z[1] - 0.4 / std]
    got = [a[0] for a in adca.step_advantages(labels, outcomes, alpha=0.1)]
    assert got == pytest.approx(want, abs=1e-6)
    assert want == pytest.approx([1.836806, -0.161710, -0.785560, -0.889535], abs=1e-6)
    plain = [a[0] for a in adca.step_advantages(labels, [1.1, -0.05, -0.05, -0.1], alpha=0.1)]
    assert plain[1] == pytest.approx(plain[2]) == pytest.approx(-0.601650, abs=1e-6)
    assert adca.self_consistency(outcomes) == 0.75  # under 0.5, the credit still counts as a failure for ADPO


class _Bus:
    def __init__(self):
        self.events = []

    async def publish(self, ev, weights_version=None):
        self.events.append(ev)


@pytest.mark.parametrize("env,credited", [("client_tools", True), ("bfcl_single", True), ("code", False), ("bfcl", False)])
def test_the_attributor_gives_the_credit_in_one_call_environments_only(tmp_path, env, credited):
    from actors.attributor import Attributor
    from config.settings import load_settings
    from policies.judge.judge import Agreement

    s = load_settings(None)
    s.state_dir, s.rollout.fit_credit = str(tmp_path), 0.3
    bus = _Bus()
    a = Attributor(s, bus=bus)
    a.agreement, a.stats = Agreement(), {"unaudited": 0}  # as start() sets them

    async def no_judge(samples, references):
        return [None] * len(samples)

    a.run_judge = no_judge
    task = Task(task_id="t1", env=env, entry_id="e1", origin="synthetic", query=ASK, reference=["get_weather(city='Oslo')"])
    samples = [_sample(x) for x in (ACCEPTED, FITS, MISFIT)]
    asyncio.run(a.handle_rollout(Rollout(task=task, group_id="g1", samples=samples), Msg()))
    (j,) = bus.events
    assert isinstance(j, Judgement)
    assert j.outcomes == pytest.approx([1.1, 0.25 if credited else -0.05, -0.05])


def test_the_credit_must_stay_under_half_so_adpo_counts_it_a_failure():
    from pydantic import ValidationError

    from config.settings import RolloutSettings

    assert RolloutSettings().fit_credit == 0.0
    with pytest.raises(ValidationError):
        RolloutSettings(fit_credit=0.5)
