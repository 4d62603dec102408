"""Memory hygiene: scrub personal data before storage; quarantine text that instructs the model.

`scrub()` replaces e-mail addresses, phone numbers, card-like digit runs, IP addresses and
API-key-like tokens with typed placeholders (`scrub_arguments()` does it inside a tool call's JSON
arguments). `looks_like_injection()` flags text that tries to give the model instructions (override
the system prompt, change role, exfiltrate secrets); such experiences are stored quarantined and
never retrieved until reviewed.
"""

from __future__ import annotations

import json
import re

_PATTERNS = [
    ("[EMAIL]", re.compile(r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b")),
    ("[KEY]", re.compile(r"\b(?:sk|pk|ghp|xox[bap])[-_][A-Za-z0-9_-]{12,}\b")),
    ("[CARD]", re.compile(r"\b(?:\d[ -]?){13,19}\b")),
    ("[IP]", re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}\b")),
    ("[PHONE]", re.compile(r"(?<!\w)\+?\d[\d ().-]{7,}\d(?!\w)")),
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
    return text


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
