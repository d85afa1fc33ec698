"""Layer 1: deterministic rules, compiled once, run in priority order.

Each rule is a compiled regex, a lowered substring or prefix test, or a keyword-set
check (every word of one set present);
the first match by (priority desc, file order) wins.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Sequence

from flywheel.classifier.settings.intents import Rule

_WORD = re.compile(r"\w+", re.UNICODE)


@dataclass(frozen=True)
class RuleMatch:
    rule_id: str
    intent: str


class RuleEngine:
    """Compiled layer-1 rules.

    Examples
    --------
    >>> from flywheel.classifier.settings.intents import Rule
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
        self._prefilter = self._compile_prefilter(self.rules)
        self._has_keywords = any(r.kind == "keywords" for r in self.rules)

    @staticmethod
    def _compile_prefilter(rules: Sequence[Rule]) -> "re.Pattern[str] | None":
        """One alternation of every pattern rule: the common no-match case costs one C-level
        scan instead of a Python call per rule. ``None`` if the patterns cannot be combined
        (e.g. a pattern with inline global flags)."""
        parts = []
        for r in rules:
            if r.kind == "regex":
                parts += [f"(?:{p})" for p in r.patterns]
            elif r.kind == "prefix":
                parts += [rf"(?:\A\s*{re.escape(p)})" for p in r.patterns]
            elif r.kind == "contains":
                parts += [re.escape(p) for p in r.patterns]
        if not parts:
            return None
        try:
            return re.compile("|".join(parts), re.IGNORECASE)
        except re.error:
            return None

    @staticmethod
    def _compile(r: Rule) -> tuple[Callable[[str, str, frozenset[str] | None], bool], bool]:
        """Return (check(text, lowered, words), needs_words)."""
        if r.kind == "keywords":
            sets = tuple(r.patterns)
            return (lambda _t, _l, words: any(s <= words for s in sets)), True
        if r.kind == "regex":
            # compiled one by one: a pattern with inline global flags such as "(?i)..." is
            # valid alone but not inside an alternation
            rxs = tuple(re.compile(p, re.IGNORECASE) for p in r.patterns)
            if len(rxs) == 1:
                rx = rxs[0]
                return (lambda t, _l, _w: rx.search(t) is not None), False
            return (lambda t, _l, _w: any(x.search(t) is not None for x in rxs)), False
        if r.kind == "prefix":
            prefixes = tuple(p.lower() for p in r.patterns)
            return (lambda _t, low, _w: low.lstrip().startswith(prefixes)), False
        needles = tuple(p.lower() for p in r.patterns)
        return (lambda _t, low, _w: any(n in low for n in needles)), False

    def match(self, text: str) -> RuleMatch | None:
        """The first matching rule, or ``None``."""
        if not self._checks:
            return None
        if self._prefilter is not None and not self._has_keywords and self._prefilter.search(text) is None:
            return None
        low = text.lower()
        words: frozenset[str] | None = None
        for m, check, needs_words in self._checks:
            if needs_words and words is None:
                words = frozenset(_WORD.findall(low))
            if check(text, low, words):
                return m
        return None
