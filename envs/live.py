"""Live traffic as an environment: a served interaction becomes a trajectory in the rollout format.

There is nothing to step: the user already did. `trajectory()` turns an `evo.interaction` into a
one-step `Sample` (the served answer is the step); feedback, when it arrives, is its outcome and
the step's signal. Experience text the live agent saw is not part of the recorded messages, so
nothing needs stripping.
"""
from __future__ import annotations

from actors.events import DEFAULT_SYSTEM, ChatMessage, Interaction, Sample
from policies.hygiene import scrub


def trajectory(it: Interaction, score: float | None = None) -> Sample:
    """The interaction as a one-step sample; personal data in the text is scrubbed (`policies/hygiene.scrub`)
    before anything trains on it."""
    msgs = [m.model_copy(update={"content": scrub(m.content)}) if m.content else m for m in [*it.messages, it.response]]
    response, msgs = msgs[-1], msgs[:-1]
    if not msgs or msgs[0].role != "system":
        msgs.insert(0, ChatMessage(role="system", content=DEFAULT_SYSTEM))
    step = len(msgs)
    msgs.append(response)
    outcome = 0.0 if score is None else float(score)
    return Sample(sample_id=it.interaction_id, messages=msgs, tools=it.tools, step_indices=[step],
                  step_signals=[outcome], outcome=outcome, experience_ids=it.experience_ids)
