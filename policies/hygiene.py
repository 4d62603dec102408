"""Memory hygiene: scrub personal data before storage; quarantine text that instructs the model.

`scrub()` replaces e-mail addresses, phone numbers, card numbers, IP addresses and API-key-like tokens
with typed placeholders (`scrub_arguments()` does it inside a tool call's JSON arguments). Phone numbers are
what Google's libphonenumber (`phonenumbers`) finds valid for `PHONE_REGION`, or any number written with a
leading `+`; a card number is a 13-19 digit run that passes the Luhn check. Dates, timestamps, order numbers
and decimals stay as written: a live sample keeps the values a call must copy. `looks_like_injection()` flags
text that tries to give the model instructions (override the system prompt, change role, exfiltrate secrets);
such experiences are stored quarantined and never retrieved until reviewed.
"""

from __future__ import annotations

import json
import re

PHONE_REGION = "US"  # how a number written without a country code is read


def _luhn(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch) * (2 if i % 2 else 1)
        total += d - 9 if d > 9 else d
    return total % 10 == 0


def _cards(text: str) -> str:
    def one(m: re.Match) -> str:
        return "[CARD]" if _luhn(re.sub(r"\D", "", m.group(0))) else m.group(0)

    return _CARD.sub(one, text)


def _glued(text: str, start: int, end: int) -> bool:
    """A match that is part of a longer number or word (3.14159265358, v2.0415555..., ab4155552671)."""
    before = text[start - 1] if start else ""
    after = text[end] if end < len(text) else ""
    return (
        before.isalnum()
        or after.isalnum()
        or (before in ".," and start > 1 and text[start - 2].isdigit())
        or (after in ".," and end + 1 < len(text) and text[end + 1].isdigit())
    )


def _phones(text: str) -> str:
    import phonenumbers

    text = _PLUS_PHONE.sub("[PHONE]", text)
    if not any(ch.isdigit() for ch in text):
        return text
    spans = [(m.start, m.end) for m in phonenumbers.PhoneNumberMatcher(text, PHONE_REGION) if not _glued(text, m.start, m.end)]
    for start, end in reversed(spans):
        text = text[:start] + "[PHONE]" + text[end:]
    return text


_CARD = re.compile(r"\b(?:\d[ -]?){12,18}\d\b")
_PLUS_PHONE = re.compile(r"(?<![\w+])\+\d[\d ().-]{6,}\d(?!\w)")
_PATTERNS = [
    ("[EMAIL]", re.compile(r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b")),
    ("[KEY]", re.compile(r"\b(?:sk|pk|ghp|xox[bap])[-_][A-Za-z0-9_-]{12,}\b")),
    ("[IP]", re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}\b")),
]

_INJECTION = re.compile(
    r"(ignore|disregard|forget|override)\b.{0,40}\b(instruction|prompt|rule|guideline|above|previous)"
    r"|\b(system prompt|developer message|jailbreak|DAN mode)\b"
    r"|\byou (are|must) now\b|\bfrom now on,? you\b|\bact as\b.{0,30}\b(unrestricted|admin|root)\b"
    r"|\b(reveal|print|leak|send)\b.{0,40}\b(password|secret|api key|credentials|system prompt)\b"
    r"|<\|im_start\|>|<\|im_end\|>",
    re.I | re.S,
)


def scrub(text: str) -> str:
    for placeholder, pattern in _PATTERNS:
        text = pattern.sub(placeholder, text)
    return _phones(_cards(text))


def scrub_arguments(text: str) -> str:
    """`scrub` for a tool call's JSON arguments: every string value in it, keys and structure kept (a call still
    parses); text that is not JSON is scrubbed whole."""

    def walk(v):
        if isinstance(v, str):
            return scrub(v)
        if isinstance(v, list):
            return [walk(x) for x in v]
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        return v

    try:
        return json.dumps(walk(json.loads(text)))
    except (ValueError, RecursionError):
        return scrub(text)


def looks_like_injection(text: str) -> bool:
    return bool(_INJECTION.search(text))
