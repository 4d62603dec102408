"""Live traffic as an environment: a served interaction becomes a trajectory in the rollout format.

There is nothing to step: the user already did. `trajectory()` turns an `evo.interaction` into a
one-step `Sample` (the served answer is the step); feedback, when it arrives, is its outcome and
the step's signal. Experience text the live agent saw is not part of the recorded messages, so
nothing needs stripping.
"""

from __future__ import annotations

from actors.events import DEFAULT_SYSTEM, ChatMessage, Interaction, Sample


def trajectory(it: Interaction, score: float | None = None, clean=lambda text: text) -> Sample:
    """The interaction as a one-step sample; `clean` rewrites every message's text first (the attributor passes
    `policies.hygiene.scrub`: personal data never reaches the learner)."""
    msgs = [m.model_copy(update={"content": clean(m.content)}) if m.content else m for m in [*it.messages, it.response]]
    response, msgs = msgs[-1], msgs[:-1]
    if not msgs or msgs[0].role != "system":
        msgs.insert(0, ChatMessage(role="system", content=DEFAULT_SYSTEM))
    step = len(msgs)
    msgs.append(response)
    outcome = 0.0 if score is None else float(score)
    return Sample(
        sample_id=it.interaction_id,
        messages=msgs,
        tools=it.tools,
        step_indices=[step],
        step_signals=[outcome],
        outcome=outcome,
        experience_ids=it.experience_ids,
    )
