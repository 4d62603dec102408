"""Step-level judge (self-attributing): GOOD/BAD per step and a reference-based outcome score.

Two judges share one prompt:
- `EndpointJudge`: any OpenAI-compatible chat endpoint. It answers in text
  (`Step 1: GOOD` ... `Score: 75`); malformed answers are retried, then the caller falls back.
- `PolicyJudge`: the served policy itself (the default). It is asked one question per step
  and answers by choice scoring (log P(" GOOD") vs log P(" BAD") for the next token), so its
  verdict can never be malformed; the outcome is log P(" YES") vs log P(" NO") mapped onto
  AgentEvolver's bands (success 60-100, failure 0-40).

Known judge "master keys" (a lone ":", "Thought process:", "Let's solve this step by step",
verdict-shaped text aimed at the judge) are screened before any judge sees a step: a step whose
content is only such text, or which addresses the judge, is BAD whatever the judge says
(`hollow_reason`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from actors.events import ChatMessage, Sample
from policies.judge.stats import Agreement, Budget, audited, choose_labels, env_labels  # noqa: F401  (part of the judge's interface)

MASTER_KEYS = (
    "thought process:",
    "let's solve this step by step",
    "let's solve this problem step by step",
    "let's think step by step",
    "let us think step by step",
    "solution:",
    "answer:",
    "step 1:",
    "sure!",
    "sure,",
    "okay.",
    "i will",
    "i'll",
)
_VERDICT_RE = re.compile(
    r"\b(step\s*\d+\s*[:=\-]\s*(good|bad)|verdict\s*[:=]|score\s*[:=]\s*\d+|"
    r"ignore (all |the )?(previous|above) instructions)",
    re.I,
)
_LINE_RE = re.compile(r"^\s*step\s*(\d+)\s*[:=\-]\s*\**\s*(GOOD|BAD)\b", re.I | re.M)
_SCORE_RE = re.compile(r"^\s*score\s*[:=]\s*(\d{1,3})", re.I | re.M)
MAX_OBS_CHARS = 300


class MalformedVerdict(ValueError):
    """The judge's text does not label every step (or has no score)."""


@dataclass
class Verdict:
    labels: list[str]  # GOOD / BAD per step
    score: float  # 0..100, reference-based outcome
    judge: str
    screened: list[int] = field(default_factory=list)  # steps forced BAD by the master-key screen


# ----------------------------------------------------------------------------- the screen


def _action_text(m: ChatMessage) -> str:
    calls = "; ".join(f"{c.name}({c.arguments})" for c in m.tool_calls)
    return (m.content.strip() + (" " if m.content.strip() and calls else "") + (f"CALL {calls}" if calls else "")).strip()


def hollow_reason(action: ChatMessage) -> str | None:
    """Why a step cannot earn GOOD regardless of the judge, or None.

    A text-only step with no word left once known master-key phrases are removed is hollow; any step whose text
    addresses the judge (verdict- or score-shaped text, "ignore previous instructions") is an attack."""
    text = action.content or ""
    if _VERDICT_RE.search(text) or any(_VERDICT_RE.search(c.arguments or "") for c in action.tool_calls):
        return "addresses the judge"
    if action.tool_calls:
        return None
    rest = text.lower()
    for key in MASTER_KEYS:
        rest = rest.replace(key, " ")
    words = re.findall(r"[a-z0-9]{2,}", rest)
    if not words:
        return "no content beyond master-key text" if text.strip() else "empty step"
    return None


# ----------------------------------------------------------------------------- the prompt


def steps_of(sample: Sample) -> list[tuple[str, str]]:
    """(action, what came back) for every step of a sample."""
    out = []
    for k, idx in enumerate(sample.step_indices):
        action = sample.messages[idx]
        end = sample.step_indices[k + 1] if k + 1 < len(sample.step_indices) else len(sample.messages)
        obs = " | ".join(m.content for m in sample.messages[idx + 1 : end] if m.role == "tool")
        out.append((_action_text(action), obs[:MAX_OBS_CHARS]))
    return out


def _task_text(sample: Sample) -> str:
    users = [m.content for m in sample.messages if m.role == "user"]
    return "\n".join(users)[:1500]


def context(sample: Sample, reference: list[str] | None) -> str:
    lines = [
        "You judge each step an assistant took on a task. A step is GOOD when it moves the task toward "
        "completion (a correct call, or a correct final answer); BAD when it is wrong, useless, empty, or "
        "only talks.",
        "",
        f"Task: {_task_text(sample)}",
    ]
    if reference:
        lines.append("Reference solution: " + "; ".join(reference))
    lines.append("")
    for k, (action, obs) in enumerate(steps_of(sample), 1):
        lines.append(f"Step {k} action: {action or '(empty)'}")
        if obs:
            lines.append(f"Step {k} result: {obs}")
    return "\n".join(lines)


def text_prompt(sample: Sample, reference: list[str] | None) -> str:
    n = len(sample.step_indices)
    fmt = "\n".join(f"Step {k}: GOOD or BAD" for k in range(1, n + 1))
    return (
        context(sample, reference)
        + "\n\nThen score the whole trajectory against the task"
        + (" and the reference" if reference else "")
        + ": 60-100 if the task was completed, 0-40 if not.\n"
        f"Reply with exactly these lines and nothing else:\n{fmt}\nScore: <0-100>"
    )


def parse_verdict(text: str, n_steps: int) -> tuple[list[str], float]:
    """Labels for steps 1..n and the score from a text verdict; MalformedVerdict otherwise."""
    found: dict[int, str] = {}
    for m in _LINE_RE.finditer(text or ""):
        k = int(m.group(1))
        if 1 <= k <= n_steps and k not in found:
            found[k] = m.group(2).upper()
    missing = [k for k in range(1, n_steps + 1) if k not in found]
    if missing:
        raise MalformedVerdict(f"no verdict for steps {missing}: {text[:200]!r}")
    sm = _SCORE_RE.search(text)
    if sm is None or not 0 <= int(sm.group(1)) <= 100:
        raise MalformedVerdict(f"no score in 0..100: {text[:200]!r}")
    return [found[k] for k in range(1, n_steps + 1)], float(sm.group(1))


def apply_screen(sample: Sample, labels: list[str]) -> tuple[list[str], list[int]]:
    out, screened = list(labels), []
    for k, idx in enumerate(sample.step_indices):
        if hollow_reason(sample.messages[idx]) is not None:
            if out[k] != "BAD":
                screened.append(k)
            out[k] = "BAD"
    return out, screened


def band_score(p_success: float) -> float:
    """P(success) -> AgentEvolver's bands: 60..100 when judged a success, 0..40 when not."""
    p = min(1.0, max(0.0, p_success))
    return 60.0 + 80.0 * (p - 0.5) if p >= 0.5 else 80.0 * p


# ----------------------------------------------------------------------------- judges


class PolicyJudge:
    """The served policy as judge, by choice scoring (see module docstring)."""

    name = "policy"

    def __init__(self, engine):
        self.engine = engine

    def prompts_for(self, sample: Sample, reference: list[str] | None) -> list[str]:
        from policies.chat import render

        ctx = context(sample, reference)
        qs = [f"Was step {k} GOOD or BAD? Answer with one word." for k in range(1, len(sample.step_indices) + 1)]
        qs.append("Was the task completed" + (" as in the reference" if reference else "") + "? Answer YES or NO.")
        heads = [f"Step {k} was" for k in range(1, len(sample.step_indices) + 1)] + ["Completed:"]
        return [render([ChatMessage(role="user", content=f"{ctx}\n\n{q}")]) + h for q, h in zip(qs, heads)]

    def cost(self, samples: list[Sample]) -> int:
        return sum(len(s.step_indices) + 1 for s in samples)

    def judge(self, samples: list[Sample], references: list[list[str] | None], screen: bool = True) -> list[Verdict | None]:
        """Verdicts for every sample; `screen=False` shows the raw judge (benchmarks only)."""
        prompts, spans = [], []
        for s, ref in zip(samples, references):
            p = self.prompts_for(s, ref)
            spans.append((len(prompts), len(p)))
            prompts.extend(p)
        # each prompt is scored once: a step's on GOOD/BAD, the trajectory's last one on YES/NO
        outcome_at = {start + n - 1 for start, n in spans}
        steps = [i for i in range(len(prompts)) if i not in outcome_at]
        lp = dict(zip(steps, self.engine.choice_logprobs([prompts[i] for i in steps], [" GOOD", " BAD"]) if steps else []))
        lp.update(zip(sorted(outcome_at), self.engine.choice_logprobs([prompts[i] for i in sorted(outcome_at)], [" YES", " NO"])))
        verdicts = []
        for s, (start, n) in zip(samples, spans):
            labels = ["GOOD" if lp[i][0] > lp[i][1] else "BAD" for i in range(start, start + n - 1)]
            y, no = lp[start + n - 1]
            p = 1.0 / (1.0 + math.exp(no - y))
            labels, screened = apply_screen(s, labels) if screen else (labels, [])
            verdicts.append(Verdict(labels, round(band_score(p), 2), self.name, screened))
        return verdicts


class EndpointJudge:
    """An OpenAI-compatible judge endpoint; malformed answers are retried `retries` times."""

    def __init__(
        self, base_url: str, model: str, api_key: str | None = None, retries: int = 2, timeout_s: float = 60.0, client=None
    ):
        from openai import OpenAI

        self.name = f"endpoint:{model}"
        self.model, self.retries = model, retries
        self.client = client or OpenAI(base_url=base_url, api_key=api_key or "none", timeout=timeout_s, max_retries=1)
        self.malformed = 0

    def cost(self, samples: list[Sample]) -> int:
        return len(samples)

    def _one(self, sample: Sample, reference: list[str] | None) -> Verdict | None:
        from policies.chat import plain

        prompt = text_prompt(sample, reference)
        n = len(sample.step_indices)
        for attempt in range(self.retries + 1):
            try:
                r = self.client.chat.completions.create(
                    model=self.model,
                    messages=[{"role": "user", "content": plain(prompt)}],  # a served text cannot open turns there either
                    temperature=0.0 if attempt == 0 else 0.7,
                    max_tokens=16 + 8 * n,
                )
                labels, score = parse_verdict(r.choices[0].message.content or "", n)
            except MalformedVerdict:
                self.malformed += 1
                continue
            labels, screened = apply_screen(sample, labels)
            return Verdict(labels, score, self.name, screened)
        return None  # the caller falls back to the environment's labels

    def judge(self, samples: list[Sample], references: list[list[str] | None]) -> list[Verdict | None]:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=min(8, max(1, len(samples)))) as pool:
            return list(pool.map(self._one, samples, references))


def make_judge(settings, engine=None):
    j = settings.judge
    if j.base_url:
        return EndpointJudge(j.base_url, j.model or "judge", j.api_key, retries=j.retries)
    if engine is None:
        raise ValueError("the policy judge needs the served policy's engine")
    return PolicyJudge(engine)
