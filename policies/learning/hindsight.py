"""Hindsight: an unrated live step taught by its own next turn (OpenClaw-RL's on-policy distillation).

Sometimes the next turn of a live step says what went wrong: the tool's error, or the user's correction or re-ask.
Such a step trains with no score. The teacher is the same weights, shown that next turn as a hint before the step;
the student is the step the policy wrote without the hint. Token t of the step gets the advantage

    A_t = clip(log pi(a_t | context + hint) - log pi(a_t | context), -clip, +clip)

Both log-probs are taken under the weights being trained, before the update. The usual clipped surrogate then moves
each token toward what the policy would have written had it known. Tokens the hint makes likelier go up; tokens it
makes less likely (a wrong value, a missing argument) go down. Tokens it leaves alone get no push.

The hint is data. It is quoted inside the teacher's context, and nothing in it is followed or executed here. It is
never part of the trained text: the student's context is the sample as it was served. So a hint can only re-weight
tokens the policy wrote itself; it adds no text of its own to what is learned. It is scrubbed like every
live message (`policies.hygiene.scrub`), and it is cut to `HINT_CHARS`.

Which scorer to use for unrated live steps, and why this one: `tests/benchmarks/bench_hindsight.py` and
`tests/benchmarks/LOG.md`.
"""

from __future__ import annotations

import re

from actors.events import ChatMessage, Sample
from policies.hygiene import scrub

# signals that say what was wrong: the next turn (a correction, a re-ask, a tool's error), or why a call does not fit
HINTED = ("invalid_call", "correction", "reask", "tool_error")
HINT_CHARS = 600
_CLOSE = re.compile(r"</(next_turn>)", re.I)  # the quote's closing tag in any case: a model reads </NEXT_TURN> as one too
HINT = (
    "(Hindsight, for you only: your first answer to this got the reply below. Answer so that it would not "
    "have happened.)\n<next_turn>\n{next}\n</next_turn>"
)


def next_turn(after: list[ChatMessage]) -> str:
    """What came after a step, as one quoted text: each tool result and the user's next message, scrubbed of personal
    data (`policies.hygiene.scrub`) before it is cut to `HINT_CHARS`: a cut through an address or a number would
    leave a piece no pattern finds."""
    parts = []
    for m in after:
        if m.role == "tool":
            parts.append(f"tool: {scrub(m.content or '')}")
        elif m.role == "user":
            parts.append(f"user: {scrub(m.content or '')}")
            break  # the user's next message ends the next turn
    return _CLOSE.sub(r"</ \1", "\n".join(parts)[:HINT_CHARS])  # the quote cannot be closed early


def teacher_messages(messages: list[ChatMessage], step: int, hint: str) -> list[ChatMessage]:
    """The context of the step at index `step` with the hint in it: appended to the last user message before the
    step (or, when there is none, as a user message right before it). Messages from `step` on are unchanged."""
    note = HINT.format(next=hint)
    last = max((i for i in range(step) if messages[i].role == "user"), default=None)
    if last is None:
        return [*messages[:step], ChatMessage(role="user", content=note), *messages[step:]]
    m = messages[last]
    return [*messages[:last], m.model_copy(update={"content": f"{m.content or ''}\n\n{note}"}), *messages[last + 1 :]]


def teacher_sample(sample: Sample) -> Sample:
    """The sample as the teacher sees it: its one step, with the hint in the context (`Sample.hint`)."""
    step = sample.step_indices[-1]
    msgs = teacher_messages(sample.messages, step, sample.hint)
    return sample.model_copy(update={"messages": msgs, "step_indices": [step + len(msgs) - len(sample.messages)]})


def aligned(student_ids: list[int], student_mask: list[int], teacher_ids: list[int], teacher_mask: list[int]):
    """(student positions, teacher positions) of the step's tokens, or None when the two tokenisations of the
    step differ (cut to the token limit, say): then the sample gets no hindsight advantage."""
    s = [i for i, m in enumerate(student_mask) if m]
    t = [i for i, m in enumerate(teacher_mask) if m]
    if not s or len(s) != len(t) or any(student_ids[i] != teacher_ids[j] for i, j in zip(s, t)):
        return None
    return s, t


def token_advantages(teacher_lp, student_lp, clip: float):
    """A_t = clip(teacher - student, -clip, clip), per step token (1-D tensors of equal length)."""
    return (teacher_lp - student_lp).clamp(-clip, clip)


def step_advantages(logprobs, student, teacher, clip: float):
    """The student's [T] advantages from its teacher (both `grpo.Tokenized`), or None where their steps do not align;
    `logprobs(ids) -> [T]` gives log-probs under the weights being trained."""
    import torch

    pos = aligned(student.input_ids, student.response_mask, teacher.input_ids, teacher.response_mask)
    if pos is None:
        return None
    s_lp, t_lp = logprobs(student.input_ids), logprobs(teacher.input_ids)
    adv = torch.zeros(len(student.input_ids))
    adv[pos[0]] = token_advantages(t_lp[pos[1]], s_lp[pos[0]], clip)
    return adv


def apply(adv, hinted: dict, tokenized: list, tokenize, model, bf16: bool, clip: float) -> int:
    """In place: the rows of `adv` [B, T] whose sample has a hint (`hinted`: row -> Sample) get hindsight's
    advantages instead of the group's. Returns how many did (a row whose step does not align keeps its own)."""
    import torch

    from policies.learning import grpo

    def logprobs(ids):
        x = torch.tensor([ids], device=next(model.parameters()).device)
        return grpo.token_logprobs(model, x, torch.ones_like(x), bf16)[0].float().cpu()

    done = 0
    with torch.no_grad():
        for i, s in hinted.items():
            a = step_advantages(logprobs, tokenized[i], tokenize(teacher_sample(s)), clip)
            if a is not None:
                adv[i] = 0.0
                adv[i, : len(a)] = a[: adv.shape[1]]
                done += 1
    return done
