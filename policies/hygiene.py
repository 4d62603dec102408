"""Memory hygiene: scrub personal data before storage; quarantine text that instructs the model.

`scrub()` replaces e-mail addresses, phone numbers, card numbers, IP addresses, SSNs and API-key-like tokens
with typed placeholders (`scrub_arguments()` does it inside a tool call's JSON arguments). A phone number is one
written with a leading `+`, or a phone-shaped run that Google's libphonenumber (`phonenumbers`) finds valid for
`PHONE_REGION` (or, written with a trunk 0, for one of `TRUNK_REGIONS`); a card number is a 13-19 digit run in a
card's grouping that passes the Luhn check; a US social security number is written 123-45-6789. Dates, timestamps, order numbers
and decimals stay as written: a live sample keeps the values a call must copy. `looks_like_injection()` flags
text that tries to give the model instructions (override the system prompt, change role, exfiltrate secrets);
such experiences are stored quarantined and never retrieved until reviewed.
"""

from __future__ import annotations

import json
import re

PHONE_REGION = "US"  # how a number written without a country code is read
# a number written with a trunk 0 (a national form outside North America) is a phone number if valid in one of these
TRUNK_REGIONS = ("GB", "DE", "FR", "IT", "ES", "NL", "AU", "IN", "JP", "BR", "ZA", "TR")


def _luhn(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch) * (2 if i % 2 else 1)
        total += d - 9 if d > 9 else d
    return total % 10 == 0


def _cards(text: str) -> str:
    def one(m: re.Match) -> str:
        return "[CARD]" if _luhn(re.sub(r"\D", "", m.group(0))) else m.group(0)

    for pattern in _CARDS:
        text = pattern.sub(one, text)
    return text


def _phone(m: re.Match) -> str:
    import phonenumbers

    cand = m.group(0)
    if _DATE.fullmatch(cand.strip("()")):
        return cand
    regions = (PHONE_REGION, *TRUNK_REGIONS) if cand.lstrip("(").startswith("0") else (PHONE_REGION,)
    for region in regions:
        try:
            if phonenumbers.is_valid_number(phonenumbers.parse(cand, region)):
                return "[PHONE]"
        except phonenumbers.NumberParseException:
            continue
    return cand


# card numbers: 4-digit groups (16-19 digits), Amex's 4-6-5, or one run; issuers' first digits 2-6; then Luhn
_CARDS = (
    re.compile(r"(?<![\d.])[2-6]\d{3}([ -]?)\d{4}\1\d{4}\1\d{1,7}(?![\d]|\.\d)"),
    re.compile(r"(?<![\d.])3[47]\d{2}([ -]?)\d{6}\1\d{5}(?![\d]|\.\d)"),
    re.compile(r"(?<![\d.])[2-6]\d{12,18}(?![\d]|\.\d)"),
)
_PLUS_PHONE = re.compile(r"(?<![\w+])\+\d[\d ().-]{6,}\d(?!\w)")
# a phone-shaped run (not part of a decimal or a word), checked by libphonenumber (`_phone`)
_PHONE_LIKE = re.compile(r"(?<![\w.(])\(?\d[\d ().-]{7,}\d(?!\w|\.\d)")
_DATE = re.compile(r"\d{4}[./-]\d{1,2}[./-]\d{1,2}|\d{1,2}[./-]\d{1,2}[./-]\d{2,4}")
_PATTERNS = [
    ("[EMAIL]", re.compile(r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b")),
    ("[KEY]", re.compile(r"\b(?:sk|pk|ghp|xox[bap])[-_][A-Za-z0-9_-]{12,}\b")),
    ("[IP]", re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}\b")),
    ("[SSN]", re.compile(r"\b\d{3}-\d{2}-\d{4}\b")),
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
    return _PHONE_LIKE.sub(_phone, _PLUS_PHONE.sub("[PHONE]", _cards(text)))


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
