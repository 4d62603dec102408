"""Live traffic as an environment: a served interaction becomes a trajectory in the rollout format.

There is nothing to step: the user already did. `trajectory()` turns an `evo.interaction` into a
one-step `Sample` (the served answer is the step); feedback, when it arrives, is its outcome and
the step's signal. Experience text the live agent saw is not part of the recorded messages, so
nothing needs stripping.

A live step with a signal can also become a group: the explorer re-samples the step from the same context (the
client's tools cannot be run here, so only the step is), and `alternative_outcome` scores each alternative without
a user, by what is certain about it:

| alternative (the first row that applies) | outcome |
|---|---|
| the same calls (or text) as the served step | the served step's outcome (its signal) |
| no call where the request required one or the served step made one | -0.9 |
| a call that does not fit the declared tools (`envs/tool_fit.py`) | -0.9, as `invalid_call` |
| anything else | 0.0: it fits, and nobody has said it is wrong |

So within the group a call that cannot be right ranks below what the user was served, and what the user turned
down ranks below a fitting answer they have not seen; an answer they took well (`thanks`, `tool_ok`) ranks above it.

With `conversations.teach: confirmed` only steps their next turn took well arrive here, and such a step's one call
is the group's reference (`confirmed_alternatives`): every answer of the group, the served one included, is checked
against it by BFCL's AST checker on the request's own schema (`envs/client_check.py`) and scored as practice on the
clients' tools is: accepted 1.0 (step +1), rejected 0.0 (step -0.5, with the checker's reason), no call 0.0 (step
-1). What the user took is then the answer to learn, and a fitting call that differs from it is not; a step of
several calls, a call that does not fit the declared schema, or a function whose schema the checker cannot read is
scored by the table above instead.

With `conversations.teach: consensus`, a step the next turn turned down (a correction, a re-ask, a tool's error, a
call that does not fit) has no reference from its user, so its re-sampled answers vote (`consensus_alternatives`,
majority-vote rewards as in TTRL and Agent0's self-consistency): the one call that a strict majority of them give
(at least 2; BFCL's AST checker on the request's schema decides which answers give the same call) is the group's
reference, and every answer, the served one included, is checked against it as above. No such majority, or a
majority for the call the user turned down: the group trains nothing. A step the next turn took well is scored as
with `confirmed`.
"""

from __future__ import annotations

import json

from actors.events import DEFAULT_SYSTEM, ChatMessage, Interaction, Sample, ToolSpec
from envs.bfcl_single import OneCallEpisode
from envs.client_check import Unjudgeable, check
from envs.tool_fit import misfit

MISFIT = -0.9  # an alternative that cannot be right: as a served step the `invalid_call` rule gives (-1.0 x 0.9)
UNSEEN = 0.0  # a fitting alternative nobody has judged
REPEATED, FITS = "the served step again", "fits the declared tools"


def cleaned_tool(tool: ToolSpec, clean, clean_arguments) -> ToolSpec:
    """A declared tool with its description rewritten by `clean` and every string of its parameters' schema
    (descriptions at any depth, enums, defaults, examples) by `clean_arguments`, keys kept: as live samples and the
    questioner's kept tool sets hold them (`policies.hygiene.scrub`, `scrub_arguments`)."""
    f = tool.function
    params = json.loads(clean_arguments(json.dumps(f.parameters or {})))
    return ToolSpec(function={"name": f.name, "description": clean(f.description or ""), "parameters": params})


def trajectory(it: Interaction, score: float | None = None, clean=lambda text: text, clean_arguments=lambda text: text) -> Sample:
    """The interaction as a one-step sample; `clean` rewrites every message's text and `clean_arguments` every tool
    call's arguments first (the attributor passes `policies.hygiene.scrub` and `scrub_arguments`: personal data never
    reaches the learner), and the declared tools' schemas too (`cleaned_tool`)."""

    def cleaned(m: ChatMessage) -> ChatMessage:
        calls = [c.model_copy(update={"arguments": clean_arguments(c.arguments)}) for c in m.tool_calls]
        return m.model_copy(update={"content": clean(m.content) if m.content else m.content, "tool_calls": calls})

    msgs = [cleaned(m) for m in [*it.messages, it.response]]
    response, msgs = msgs[-1], msgs[:-1]
    if not msgs or msgs[0].role != "system":
        msgs.insert(0, ChatMessage(role="system", content=DEFAULT_SYSTEM))
    step = len(msgs)
    msgs.append(response)
    outcome = 0.0 if score is None else float(score)
    return Sample(
        sample_id=it.interaction_id,
        messages=msgs,
        tools=[cleaned_tool(t, clean, clean_arguments) for t in it.tools],
        step_indices=[step],
        step_signals=[outcome],
        outcome=outcome,
        experience_ids=it.experience_ids,
    )


def call_key(m: ChatMessage):
    """What an answer says, comparable across re-serialisations: its calls (name, arguments with sorted keys), or
    its text with whitespace collapsed."""
    calls = []
    for c in m.tool_calls:
        try:
            calls.append([c.name, json.dumps(json.loads(c.arguments or "{}"), sort_keys=True)])
        except (ValueError, RecursionError):
            calls.append([c.name, (c.arguments or "").strip()])
    return calls or " ".join((m.content or "").split())


def call_required(tool_choice) -> bool:
    return tool_choice == "required" or isinstance(tool_choice, dict)


def alternative_outcome(
    alt: ChatMessage, served: ChatMessage, served_outcome: float, tools: list[ToolSpec], tool_choice=None
) -> tuple[float, str]:
    """(outcome, why) of a re-sampled alternative of a served step (the module docstring's table)."""
    if call_key(alt) == call_key(served):
        return served_outcome, REPEATED
    if (call_required(tool_choice) or served.tool_calls) and not alt.tool_calls:
        return MISFIT, "no call where the request required one, or the served step made one"
    if alt.tool_calls and (why := misfit(alt.tool_calls, tools)) is not None:
        return MISFIT, why
    return UNSEEN, FITS


def alternatives(step: Sample, answers: list[ChatMessage], tool_choice=None) -> list[Sample]:
    """The served step's sample (`step`: its context, its answer, its outcome) and one sample per re-sampled answer,
    scored by `alternative_outcome`: a group of one live step. Only the served one keeps the hindsight hint."""
    i = step.step_indices[-1]
    context, served = step.messages[:i], step.messages[i]
    out = [step]
    for k, a in enumerate(answers):
        outcome, why = alternative_outcome(a, served, step.outcome, step.tools, tool_choice)
        out.append(
            Sample(
                sample_id=f"{step.sample_id}:alt{k}",
                messages=[*context, a],
                tools=step.tools,
                step_indices=[i],
                step_signals=[outcome],
                outcome=outcome,
                error=None if why in (REPEATED, FITS) else why,
            )
        )
    return out


class _AgainstServed(OneCallEpisode):
    """One answer of a confirmed step's group, scored as practice on the clients' tools is (`OneCallEpisode.step`),
    against the served call."""

    def __init__(self, tools: list[ToolSpec], reference):
        super().__init__("", "", tools)
        self.reference = reference

    def judge(self, calls):
        return check(calls, self.tools, self.reference)


def _checked(sample_id: str, context: list[ChatMessage], answer: ChatMessage, step: Sample, reference) -> Sample:
    episode = _AgainstServed(step.tools, reference)
    r = episode.step(answer)
    return Sample(
        sample_id=sample_id,
        messages=[*context, answer],
        tools=step.tools,
        step_indices=[len(context)],
        step_signals=[r.signal],
        outcome=episode.outcome(),
        error=episode.error or None,
    )


def confirmed_alternatives(step: Sample, answers: list[ChatMessage]) -> list[Sample] | None:
    """A confirmed step's group (the module docstring): the served step and each answer checked against the served
    call, or None where that call cannot be the reference (several calls, or a schema the checker cannot read)."""
    i = step.step_indices[-1]
    context, served = step.messages[:i], step.messages[i]
    if len(served.tool_calls) != 1 or misfit(served.tool_calls, step.tools) is not None:
        return None  # a call the declared schema refuses is taught to nobody, whatever its next turn said
    reference = served.tool_calls[0]
    try:
        if not check(served.tool_calls, step.tools, reference)[0]:  # refused against itself: nobody's reference
            return None
        rest = [_checked(f"{step.sample_id}:alt{k}", context, a, step, reference) for k, a in enumerate(answers)]
    except Unjudgeable:
        return None
    return [step.model_copy(update={"outcome": 1.0, "step_signals": [1.0], "error": None}), *rest]


def consensus_alternatives(step: Sample, answers: list[ChatMessage]) -> list[Sample] | None:
    """A turned-down step's group (the module docstring): the served step and each answer checked against the call a
    strict majority of the answers give, or None where there is no such call, it is the one the user turned down, or the
    checker cannot read the schema."""
    i = step.step_indices[-1]
    context, served = step.messages[:i], step.messages[i]
    voters = [a.tool_calls for a in answers if len(a.tool_calls) == 1 and misfit(a.tool_calls, step.tools) is None]

    def votes_for(reference) -> int:  # a call of a function whose schema the checker cannot read gets none
        try:
            return sum(check(v, step.tools, reference)[0] for v in voters)
        except Unjudgeable:
            return 0

    try:
        votes = [votes_for(calls[0]) for calls in voters]
        best = max(range(len(voters)), key=votes.__getitem__, default=None)
        if best is None or votes[best] < 2 or 2 * votes[best] <= len(answers):
            return None
        reference = voters[best][0]
        if served.tool_calls and check(served.tool_calls, step.tools, reference)[0]:
            return None  # the majority gives what the user turned down
        first = _checked(step.sample_id, context, served, step, reference)
        rest = [_checked(f"{step.sample_id}:alt{k}", context, a, step, reference) for k, a in enumerate(answers)]
    except Unjudgeable:
        return None
    return [step.model_copy(update={k: getattr(first, k) for k in ("outcome", "step_signals", "error")}), *rest]
