"""Layer 1: deterministic rules, compiled once, run in priority order.

Each rule is a compiled regex, a lowered substring or prefix test, or a keyword-set
check (every word of one set present);
the first match by (priority desc, file order) wins.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Sequence

from classifier.intents import Rule

_WORD = re.compile(r"\w+", re.UNICODE)


@dataclass(frozen=True)
class RuleMatch:
    rule_id: str
    intent: str


class RuleEngine:
    """Compiled layer-1 rules.

    Examples
    --------
    >>> from classifier.intents import Rule
    >>> eng = RuleEngine([Rule(id="p", intent="PLATFORM", kind="prefix", patterns=("you are",))])
    >>> eng.match("You are a bot").rule_id
    'p'
    >>> eng.match("hello") is None
    True
    """

    def __init__(self, rules: Sequence[Rule]) -> None:
        ordered = sorted(enumerate(rules), key=lambda t: (-t[1].priority, t[0]))
        self.rules = [r for _, r in ordered]
        self._checks: list[tuple[RuleMatch, Callable[[str, str, frozenset[str] | None], bool], bool]] = []
        for r in self.rules:
            self._checks.append((RuleMatch(r.id, r.intent), *self._compile(r)))

    @staticmethod
    def _compile(r: Rule) -> tuple[Callable[[str, str, frozenset[str] | None], bool], bool]:
        """Return (check(text, lowered, words), needs_words)."""
        if r.kind == "keywords":
            sets = tuple(r.patterns)
            return (lambda _t, _l, words: any(s <= words for s in sets)), True  # type: ignore[operator]
        if r.kind == "regex":
            rx = re.compile("|".join(f"(?:{p})" for p in r.patterns), re.IGNORECASE)
            return (lambda t, _l, _w: rx.search(t) is not None), False
        if r.kind == "prefix":
            prefixes = tuple(p.lower() for p in r.patterns)
            return (lambda _t, low, _w: low.lstrip().startswith(prefixes)), False
        needles = tuple(p.lower() for p in r.patterns)
        return (lambda _t, low, _w: any(n in low for n in needles)), False

    def match(self, text: str) -> RuleMatch | None:
        """The first matching rule, or ``None``."""
        if not self._checks:
            return None
        low = text.lower()
        words: frozenset[str] | None = None
        for m, check, needs_words in self._checks:
            if needs_words and words is None:
                words = frozenset(_WORD.findall(low))
            if check(text, low, words):
                return m
        return None
