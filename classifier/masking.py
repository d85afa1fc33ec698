"""Optional masking of personal data before a query is logged.

:func:`mask_pii` replaces e-mail addresses, IBANs (ISO 13616 mod-97 checked), payment card
numbers (13 to 19 digits, Luhn checked) and phone numbers with typed placeholders:
``<EMAIL>``, ``<IBAN>``, ``<CARD>``, ``<PHONE>``. It runs on the text written to the
traffic log (and the history snippets logged with it), never on what layer 2 or the teacher
see: they still get the raw query, because masking changes meaning ("send it to
ana@example.com" is a request about e-mail). Turn it on with the config key ``mask_pii``
(``FLYWHEEL_MASK_PII=1``).

Checks keep false positives down: a digit run that fails Luhn is not a card, a string that
fails mod-97 is not an IBAN. Phone numbers have no checksum: a run of 9 to 15 digits, or 7 to 15 after a ``+``
(with spaces, dots, dashes or parentheses between them), counts as one; dates, version
strings and order numbers (8 digits or fewer without a ``+``) are left alone.
"""

from __future__ import annotations

import re

__all__ = ["mask_pii", "luhn_ok", "iban_ok", "PLACEHOLDERS"]

PLACEHOLDERS = ("<EMAIL>", "<IBAN>", "<CARD>", "<PHONE>")

_EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")
_IBAN = re.compile(r"\b[A-Z]{2}\d{2}(?:[ ]?[A-Z0-9]{4}){2,7}(?:[ ]?[A-Z0-9]{1,3})?\b")
_CARD = re.compile(r"(?<![\d])\d(?:[ -]?\d){12,18}(?![\d])")
_PHONE = re.compile(r"(?<![\w+])(?<!\d[ .-])(?:\+\(?\d(?:[ .()-]{0,2}\d){6,14}|\(?\d(?:[ .()-]{0,2}\d){8,14})"
                    r"(?![ .-]?\d)")


def luhn_ok(digits: str) -> bool:
    """Whether a string of digits passes the Luhn check (payment card numbers)."""
    total, double = 0, False
    for ch in reversed(digits):
        d = ord(ch) - 48
        if double:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
        double = not double
    return len(digits) >= 2 and total % 10 == 0


def iban_ok(candidate: str) -> bool:
    """Whether ``candidate`` (spaces allowed) is a well-formed IBAN by its mod-97 check."""
    s = candidate.replace(" ", "").upper()
    if not 15 <= len(s) <= 34 or not s[:2].isalpha() or not s[2:4].isdigit():
        return False
    moved = s[4:] + s[:4]
    return int("".join(str(int(c, 36)) for c in moved)) % 97 == 1


def _card(m: re.Match[str]) -> str:
    digits = re.sub(r"\D", "", m.group(0))
    return "<CARD>" if luhn_ok(digits) else m.group(0)


def _iban(m: re.Match[str]) -> str:
    return "<IBAN>" if iban_ok(m.group(0)) else m.group(0)


def mask_pii(text: str) -> str:
    """``text`` with e-mails, IBANs, card numbers and phone numbers replaced (see the module docs)."""
    if not text:
        return text
    out = _EMAIL.sub("<EMAIL>", text)
    out = _IBAN.sub(_iban, out)
    out = _CARD.sub(_card, out)
    return _PHONE.sub("<PHONE>", out)
