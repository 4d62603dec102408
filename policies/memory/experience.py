"""The navigator's experience policy: what a judged group teaches, in words, and how experiences are valued.

- `distil`: one success and/or one failure experience per judged group (best and worst sample), with
  personal data scrubbed and instruction-like text quarantined;
- `retrieval_key`: experiences are found by the request they apply to, not by their advice;
- `guided_helped`, `utility`, `decay`: whether guidance helped, the Laplace-smoothed share of uses that
  helped, and age decay, which rank retrieval and decide retirement;
- `to_row` / `from_row`: an experience as a Milvus Lite row and back (the pool keeps what a later change
  of the experience needs).
"""

from __future__ import annotations

import json
import time
from datetime import datetime

from actors.events import Experience, Judgement, Sample, derived_id
from policies.hygiene import looks_like_injection, scrub


def _calls(sample: Sample) -> list[str]:
    return [tc.name for m in sample.messages if m.role == "assistant" for tc in m.tool_calls]


def _query(sample: Sample) -> str:
    users = [m.content for m in sample.messages if m.role == "user"]
    return users[0] if users else ""


def _call_texts(sample: Sample) -> list[str]:
    out = []
    for m in sample.messages:
        if m.role == "assistant":
            for tc in m.tool_calls:
                args = tc.arguments if len(tc.arguments) <= 80 else tc.arguments[:77] + "..."
                out.append(f"{tc.name}({args})" if args not in ("", "{}") else f"{tc.name}()")
    return out


def distil(j: Judgement) -> list[Experience]:
    """One success and/or one failure experience per judged group (best and worst sample)."""
    if not j.samples:
        return []
    order = sorted(range(len(j.samples)), key=lambda i: j.outcomes[i])
    worst, best = order[0], order[-1]
    origin = "live" if j.source == "live" else j.origin if j.origin in ("env", "synthetic") else "env"
    out = []
    picks = [(best, True)] if j.outcomes[best] >= 0.5 else []
    if j.outcomes[worst] < 0.5 and (not picks or worst != best):
        picks.append((worst, False))
    for i, success in picks:
        s = j.samples[i]
        raw = _query(s)
        when = scrub(raw)[:200]  # personal data never reaches memory
        calls = _calls(s)
        if success:
            how = f"calling {', '.join(_call_texts(s)[:4])} in that order worked" if calls else "a direct text answer worked"
            text = f'For a request like "{when[:120]}": {how}.'
        else:
            what = f"calling {', '.join(calls[:6])}" if calls else "answering without calling any function"
            err = f" (error: {s.error[:100]})" if s.error else ""
            text = f'For a request like "{when[:120]}": {what} did not complete it{err}; try a different approach.'
        comment = j.comments[i].strip() if i < len(j.comments) else ""
        if comment:  # a user's correction is the most useful part of a live experience
            text += f' The user said: "{scrub(comment)[:200]}"'
        eid = derived_id("experience", f"{j.event_id}:{int(success)}")
        state = "quarantined" if looks_like_injection(raw) or looks_like_injection(text) else "active"
        user = j.user_hashes[i] if i < len(j.user_hashes) else None
        out.append(
            Experience(
                event_id=eid,
                experience_id=eid,
                text=scrub(text)[:2000],
                when=when,
                success=success,
                origin=origin,
                source_event_ids=[j.event_id],
                trace_id=j.trace_id,
                state=state,
                user_hash=user,
                reason="new" if state == "active" else "quarantined: instruction-like",
                created_at=j.occurred_at,
                weights_version=j.weights_version,
            )
        )
    return out


def retrieval_key(e: Experience) -> str:
    """What an experience is found by: the situation it applies to (the request), not its advice, so
    that a new request lands next to the experiences of similar requests."""
    return e.when or e.text


def guided_helped(j: Judgement) -> dict[str, bool]:
    """Experience id -> did its guided samples beat the unguided ones of the same group?"""
    g = [o for s, o in zip(j.samples, j.outcomes) if s.guided]
    u = [o for s, o in zip(j.samples, j.outcomes) if not s.guided and not s.off_policy]
    if not g or not u:
        return {}
    helped = sum(g) / len(g) > sum(u) / len(u)
    return {e: helped for s in j.samples if s.guided for e in s.experience_ids}


def utility(uses: int, helped: int) -> float:
    """Laplace-smoothed share of uses that helped (0.5 with no evidence)."""
    return (helped + 1) / (uses + 2)


def decay(created_at: str | None, half_life_days: float, now: float | None = None) -> float:
    if not created_at or half_life_days <= 0:
        return 1.0
    try:
        t = datetime.fromisoformat(created_at).timestamp()
    except ValueError:
        return 1.0
    age_days = max(0.0, ((now or time.time()) - t) / 86400)
    return 0.5 ** (age_days / half_life_days)


def to_row(e: Experience, vec: list[float]) -> dict:
    return {
        "id": e.experience_id,
        "vector": vec,
        "text": e.text,
        "success": e.success,
        "state": e.state,
        "meta": json.dumps(
            {
                "origin": e.origin,
                "sources": e.source_event_ids[-20:],
                "when": e.when,
                "weights_version": e.weights_version,
                "user_hash": e.user_hash,
                "support": e.support,
                "created_at": e.created_at or e.occurred_at,
            }
        )[:4000],
    }


def from_row(exp_id: str, m: dict, event_id: str, **update) -> Experience:
    """A change of a stored experience (its pool metadata `m`) as a new `evo.experience` with the same id."""
    base = dict(
        experience_id=exp_id,
        text=m["text"],
        when=m.get("when", ""),
        success=m["success"],
        origin=m.get("origin", "env"),
        source_event_ids=m.get("sources", []),
        state=m["state"],
        user_hash=m.get("user_hash"),
        support=m.get("support", 1),
        created_at=m.get("created_at"),
        weights_version=m.get("weights_version") or "w-000000",
    )
    return Experience(event_id=event_id, **{**base, **update})
