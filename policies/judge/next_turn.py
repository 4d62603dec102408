"""What the next turn says about a served step, by fixed patterns: the user's next message (a correction, a re-ask,
thanks, a new request) and the tool results that answer the step's calls; and whether the step's calls fit the tools
the request declared. The rules' names, values and confidences are `policies/judge/conversations.SIGNALS`; this module
decides which one fits (`signal_of`).

Text here is only matched, never followed: a tool result or a user turn is data.
"""

from __future__ import annotations

import json
import re

from actors.events import ChatMessage, ToolSpec
from envs.tool_fit import misfit

_OK_AFTER_NO = r"(problem|worries|need|rush|thanks|thank you|that'?s (all|it|fine|perfect|great|good|right|correct)|all good)"
# a leading "no" corrects, unless it answers a question the step asked ("Anything else?" "No, just the flight.")
_LEADING_NO = re.compile(r"^\s*(no|nope)\b(?!\s*(?:[,.!]\s*)?" + _OK_AFTER_NO + r"\b)", re.I)
_ADJ = r"(?:so |that |very |really |quite )?(great|good|right(?! (now|away))|correct|helpful|working)\b"
_CORRECTION = re.compile(
    r"^\s*(wrong|incorrect|try again)\b|^\s*(that'?s|that is|this is|it'?s) not\b(?! (bad|a problem|an issue))"
    r"|^\s*actually,?\s+(i (meant|said|wanted|asked|need)|it'?s|it should|you should|that should)\b"
    r"|\b(not (exactly |quite |really )?what i (asked|meant|wanted|needed|said)|that'?s (wrong|incorrect)|"
    r"you (misunderstood|got it wrong)|(it|that|this) (doesn'?t|does not|did not|didn'?t) work|is wrong|are wrong|"
    r"still (fails|failing|broken|wrong|not working|doesn'?t|does not))\b"
    r"|^\s*not " + _ADJ + r"|\b(it|that|this|which)\s*(?:'s|is|was)?\s*(?:n't|not|never)\s+" + _ADJ,
    re.I,
)
MAX_TEXT = 2000  # what is matched of a message or a tool result (patterns run on the event loop)
# thanks anywhere; approval only as the message's first word ("Find a great restaurant" is a request)
_THANKS = re.compile(
    r"\b(thanks|thank you|thx|that works|works now|works great|well done|nice one)\b"
    r"|^\s*(great|perfect|awesome|excellent|exactly|nice|cool)\b",
    re.I,
)
_BUT = re.compile(r"\b(but|however|although|though)\b", re.I)
# a tool result in text: a failure when its first line says so, or it holds a traceback or a raised error
_FAILURE = re.compile(
    r"\b(error|exception|traceback|not found|invalid|failed|failure|denied|forbidden|unauthori[sz]ed|cannot|can'?t|"
    r"could not|couldn'?t|unable to|timed out|unknown (function|command|tool)|no such)\b",
    re.I,
)
_RAISED = re.compile(r"^Traceback \(most recent call last\)|\b[A-Z]\w*(Error|Exception): ", re.M)
_FAILED_STATUS = {"error", "failed", "failure", "fail", "denied", "forbidden", "invalid", "not_found", "not found"}
# words that say nothing about what is asked, left out when comparing a request with the one before it
_STOP = frozenset(
    "a an the is are was were be been to of in on at for from and or with what whats how do does did can could "
    "would will should please about it this that there here me my you your i we our us".split()
)
_WORD = re.compile(r"[a-z0-9]+")


def _words(text: str) -> set[str]:
    """The request's content words: what a re-ask repeats."""
    return {w for w in _WORD.findall((text or "").lower()) if len(w) > 1 and w not in _STOP}


def tool_failed(content: str) -> bool:
    """Does a tool result report a failure? JSON by its fields (a non-empty `error`, `success`/`ok` false,
    `isError` true, a failing `status`); text by its first line, or a traceback or raised error anywhere in it.
    A result that merely mentions an error in its data (`{"error": null}`, a page that says "not found" further
    down) is not one."""
    text = (content or "").strip()[:MAX_TEXT]
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        data = None
    else:
        if isinstance(data, str):  # a client that JSON-encodes its tool's text
            return tool_failed(data) if data.strip() != text else False
        if isinstance(data, list):
            return any(isinstance(x, dict) and tool_failed(json.dumps(x)) for x in data[:20])
        if not isinstance(data, dict):
            return False
        low = {str(k).lower(): v for k, v in data.items()}
        status = low.get("status")
        return bool(
            low.get("error")
            or low.get("errors")
            or low.get("exception")
            or low.get("success") is False
            or low.get("ok") is False
            or low.get("iserror") is True
            or low.get("is_error") is True
            or (isinstance(status, str) and status.lower() in _FAILED_STATUS)
            or (isinstance(status, int) and not isinstance(status, bool) and status >= 400)
        )
    first = text.split("\n", 1)[0][:200]
    last = "\n".join(text.splitlines()[-5:])  # a raised error ends its output; one quoted earlier is data
    return bool(_FAILURE.search(first) or _RAISED.search(last) or text.startswith("Traceback (most recent call last)"))


def next_turn_signal(step: ChatMessage, after: list[ChatMessage], previous_user: str | None) -> str | None:
    ids = {tc.id for tc in step.tool_calls}
    results = [m for m in after if m.role == "tool" and (m.tool_call_id in ids or not m.tool_call_id)]
    user = next(((m.content or "")[:MAX_TEXT] for m in after if m.role == "user"), None)
    asked = (step.content or "").rstrip().endswith("?") and not step.tool_calls
    if user is not None and (_CORRECTION.search(user) or (not asked and _LEADING_NO.search(user))):
        return "correction"
    # a reply to the step's own question may repeat the request ("Shall I book it?" "Yes, book it"): an answer, not a re-ask
    if user is not None and previous_user and not asked:
        a, b = _words(user), _words(previous_user)
        if len(a) >= 2 and b and len(a & b) / len(a) >= 0.6:
            return "reask"
    if results and any(tool_failed(m.content) for m in results):
        return "tool_error"
    answered = {m.tool_call_id for m in results} >= ids or len(results) >= len(ids)  # (results without ids: by count)
    if step.tool_calls and not answered and user is not None:  # the user went on without the call's result: it never ran
        return "abandoned_call"
    if user is not None and _THANKS.search(user) and not _BUT.search(user):
        return "thanks"
    if step.tool_calls and results and answered:  # every call answered: one left unanswered says nothing yet
        return "tool_ok"
    if user is not None:
        return "moved_on"
    return None


POSITIVE = ("thanks", "tool_ok")  # what came next that outweighs the schema: the client ran the call and it worked


def signal_of(
    step: ChatMessage,
    after: list[ChatMessage],
    previous_user: str | None,
    tools: list[ToolSpec] = (),
    served: ChatMessage | None = None,
) -> str | None:
    """The rule that fits the step and what came after it (`after`: the messages a later request added after it), or
    None when nothing came after it yet and the step itself is not wrong. `step` is the answer as the client sent it
    back (its tool call ids are the ones its tool results answer); `served`, when given, as it was served: that is
    what is checked against the declared `tools` (a client may drop or repair a call it cannot use)."""
    nxt = next_turn_signal(step, after, previous_user)
    calls = (served or step).tool_calls
    if nxt not in POSITIVE and calls and tools and misfit(calls, tools) is not None:
        return "invalid_call"
    return nxt
