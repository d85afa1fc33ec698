"""Follow-ups: does a query lean on the previous turn? (issue 43, ADR RC-03)

A *referential follow-up* ("und wann kommt sie an?", "and the other one?", "¿y cómo lo
arreglo?", "that function crashes") cannot be scored on its own words: they carry no intent.
:class:`FollowupDetector` says when a query is one, by cues of the query's language
(detected among :data:`CUE_LANGUAGES` with :class:`~classifier.language.LanguageDetector`):

- a **cue**: a continuation opener ("and", "what about", "y", "und", "was ist mit"), a
  pronoun or deictic ("it", "that", "esto", "lo", "sie", "das"), an elliptical phrase ("the
  other one", "lo anterior", "la de", "der andere") or a Spanish clitic verb ("corrígelo");
- and **little content of its own**: at most ``max_content`` words that are none of the
  language's function words nor cues. "and I was also charged twice for the helmet" has a
  cue and its own content: it is scored on its content alone, like any self-contained query;
- and a **recent in-scope turn** in the session's compact history (one of the last
  ``recent`` entries has a label): the turn it leans on, its :attr:`Followup.anchor`.

The pipeline (``followups`` in the intent file, :data:`FOLLOWUP_MODES`) then either scores
the query together with the anchor's snippet (``resolve``: :func:`resolved_text`,
:func:`pick`) or sends it to the teacher with the history (``defer``); in both a detected
follow-up is never a *sure* out-of-scope answer of layer 2 (:func:`never_sure_oos`). The
history never moves a query the detector does not fire on (RC-03). Measured on the
follow-up benchmark's held-out sessions: BENCHMARKS.md, "Follow-ups".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Callable, Sequence

from flywheel.classifier.decision import Tier
from flywheel.classifier.language import UNKNOWN, LanguageDetector
from flywheel.classifier.layer2.tiers import Layer2Result
from flywheel.classifier.protocols import HistoryEntry

__all__ = ["CUE_LANGUAGES", "Followup", "FollowupDetector", "followup_results", "never_sure_oos", "pick",
           "resolved_text"]

_WORD = re.compile(r"[^\W\d_]+(?:['’][^\W\d_]+)?|\d+", re.UNICODE)


#: idioms whose pronoun points at nothing ("what time is it in Tokyo?"): not a cue
_DUMMY_PRONOUN = re.compile(r"\b(?:what time|how (?:far|long|late|cold|hot|warm|big))\s+is\s+it\b"
                            r"|\bit(?:'s| is) (?:raining|snowing|sunny|cold|hot)\b", re.IGNORECASE)


@dataclass(frozen=True)
class Cues:
    """One language's cue words. ``openers``: a first word (or words) that continues the
    previous turn; ``anaphors``: words that point back; ``phrases``: elliptical word pairs
    ("the other", "la de"); ``stop``: function words that are no content; ``deictics``:
    determiners whose noun points back ("that function": the noun is no content);
    ``pronoun_articles``: articles that point when no capitalised noun follows (German "wie
    schicke ich die zurück?"); ``clitic``: verbs that carry their object pronoun (Spanish)."""

    openers: frozenset[str]
    anaphors: frozenset[str]
    phrases: frozenset[str]
    stop: frozenset[str]
    deictics: frozenset[str] = frozenset()
    pronoun_articles: frozenset[str] = frozenset()
    clitic: re.Pattern[str] | None = None


def _w(text: str) -> frozenset[str]:
    return frozenset(text.split())


CUES: dict[str, Cues] = {
    "en": Cues(
        # "what about"/"how about" are phrases: a bare "what" or "how" opens any question
        openers=_w("and but also so then ok okay now plus"),
        anaphors=_w("it its that this those these them they one ones other same previous above again there"),
        phrases=_w("the_other the_previous the_last the_same what_about how_about that_one this_one"),
        stop=_w("a an the is are was were be been do does did i me my you your we our can could would will should "
                "of to for in on at by with from as how what when where why which who please yet still so much "
                "many more too very just not no exactly also now does it's doesn't don't can't isn't get "
                "take takes work works has have had"),
        deictics=_w("that this those these same other"),
    ),
    "es": Cues(
        openers=_w("y pero también entonces además o"),
        anaphors=_w("lo le les esto eso esa ese esta este estos esas esos aquello otro otra otros otras mismo "
                    "misma anterior igual ahí"),
        phrases=_w("la_de el_de los_de las_de lo_anterior lo_mismo el_otro la_otra qué_tal me_la me_lo se_la "
                   "se_lo"),
        stop=_w("el la los las un una unos unas de del a al en con por para que qué cómo cuándo dónde cuánto "
                "cuánta por qué me mi mis te tu se nos es son está están hay puedo puede pueden hago hace "
                "hacer se sí no ya muy más también ahora sigue todavía"),
        deictics=_w("esa ese esta este esos esas estos estas otro otra mismo misma"),
        clitic=re.compile(r"(?:ar|er|ir|[áéí]\w*|^haz|^di|^pon)(?:lo|la|los|las|le|les|selo|sela)$"),
    ),
    "de": Cues(
        openers=_w("und aber also dann oder auch"),
        anaphors=_w("es sie ihn ihm ihr das dies diese dieser dieses davon damit dafür dazu darauf andere anderen "
                    "anderes vorherige vorherigen dasselbe gleiche da"),
        phrases=_w("der_andere die_andere das_andere was_ist_mit wie_ist_es_mit das_gleiche"),
        stop=_w("der die den dem des ein eine einen einem einer ist sind war bin wird werden kann können ich mir "
                "mich mein meine du dein wir ihr mit von zu für auf an in im bei aus wie was wann wo warum "
                "welche welcher noch schon so sehr nicht kein keine jetzt genau immer auch bitte lange denn "
                "geht läuft mache machen ab hinzu zurück"),
        deictics=_w("diese dieser dieses diesen andere anderen"),
        pronoun_articles=_w("die der den dem"),
    ),
}
#: the languages :data:`CUES` knows (a query in another one is detected as none of them)
CUE_LANGUAGES = tuple(CUES)


@dataclass(frozen=True)
class Followup:
    """A detected follow-up: the ``cue`` that made it one, the query's ``language`` and the
    in-scope turn it leans on (``anchor``, from the compact history)."""

    cue: str
    language: str
    anchor: HistoryEntry

    def describe(self) -> str:
        """For a decision's reason: ``follow-up ('and') of ORDER_STATUS``."""
        return f"follow-up ({self.cue!r}) of {self.anchor.label}"


class FollowupDetector:
    """Decides whether a query leans on the previous turn (see the module docs).

    A query with a pointing cue (an anaphor, an elliptical phrase, a clitic) may have
    ``max_content`` content words; one with only a continuation opener ``max_content - 1``;
    a query with no content at all, or of at most three words with one, is an ellipsis
    ("why so slow?", "geht immer noch nicht"). ``recent``: how many of the last history
    entries are searched for the in-scope turn it leans on.
    """

    def __init__(self, *, max_content: int = 3, recent: int = 2) -> None:
        self.max_content = max_content
        self.recent = recent
        self._language = LanguageDetector(CUE_LANGUAGES)

    def detect(self, text: str, history: Sequence[HistoryEntry]) -> Followup | None:
        """The :class:`Followup` ``text`` is, or ``None`` (self-contained, or no recent
        in-scope turn to lean on)."""
        anchor = self.anchor(history)
        if anchor is None:
            return None
        return self._leans(text, anchor)

    def anchor(self, history: Sequence[HistoryEntry]) -> HistoryEntry | None:
        """The turn a follow-up of ``history`` leans on: the latest in-scope entry of the last
        ``recent``, or, when that one is a follow-up itself ("und jetzt?" after "Ich komme
        nicht in mein Konto"), the turn *it* leans on: a snippet with content to resolve with."""
        i = self._anchor_at(history)
        return None if i is None else history[i]

    def _anchor_at(self, history: Sequence[HistoryEntry]) -> int | None:
        found = [i for i in range(max(len(history) - self.recent, 0), len(history)) if history[i].label is not None]
        if not found:
            return None
        i = found[-1]
        while True:
            earlier = self._anchor_at(history[:i])
            if earlier is None or self._leans(history[i].snippet, history[earlier]) is None:
                return i
            i = earlier

    def _leans(self, text: str, anchor: HistoryEntry) -> Followup | None:
        """The :class:`Followup` of ``anchor`` that ``text`` is, by its cues and content."""
        raw = _WORD.findall(text)
        lang = self._language.detect(text)
        cues = CUES.get(lang)
        if not raw or cues is None:   # UNKNOWN: no language-specific cue is trusted
            return None
        cue, strong = self.cue(_WORD.findall(_DUMMY_PRONOUN.sub(" , ", text)) or raw, cues)
        content = self.content(raw, cues)
        limit = self.max_content if strong else self.max_content - 1
        if cue is not None and content <= limit:
            return Followup(cue, lang, anchor)
        if content == 0 or (len(raw) <= 3 and content <= 1):
            return Followup("ellipsis", lang, anchor)
        return None

    @staticmethod
    def cue(raw: Sequence[str], cues: Cues) -> tuple[str | None, bool]:
        """The first cue among the words ``raw`` (as written) and whether it points (an
        anaphor, phrase or clitic: ``True``) or only continues (an opener: ``False``)."""
        words = [w.lower() for w in raw]
        pairs = {"_".join(words[i:i + n]) for n in (2, 3, 4) for i in range(len(words) - n + 1)}
        found = sorted(pairs & cues.phrases)
        if found:
            return found[0].replace("_", " "), True
        for i, w in enumerate(words):
            if w in cues.anaphors or _clitic(w, cues) or (w in cues.pronoun_articles and not _noun_next(raw, i)):
                return w, True
        if words[0] in cues.openers:
            return words[0], False
        return None, False

    @staticmethod
    def content(raw: Sequence[str], cues: Cues) -> int:
        """How many of the words ``raw`` are content: none of the language's function words,
        openers or anaphors, nor a number (an order number names, it does not ask), nor the
        noun a deictic points with ("that *function*")."""
        words = [w.lower() for w in raw]
        skip = cues.stop | cues.openers | cues.anaphors | cues.pronoun_articles
        n = 0
        for i, w in enumerate(words):
            after_deictic = i > 0 and words[i - 1] in cues.deictics
            if not (w in skip or w.isdigit() or _clitic(w, cues) or after_deictic):
                n += 1
        return n

    def language(self, text: str) -> str:
        """The query's language among :data:`CUE_LANGUAGES`, or :data:`~classifier.language.UNKNOWN`."""
        return self._language.detect(text) if text.strip() else UNKNOWN


def _clitic(word: str, cues: Cues) -> bool:
    return cues.clitic is not None and len(word) > 4 and cues.clitic.search(word) is not None


def _noun_next(raw: Sequence[str], i: int) -> bool:
    """Whether the word after ``raw[i]`` is capitalised (a German noun: ``die`` is its article)."""
    return i + 1 < len(raw) and raw[i + 1][:1].isupper()


def resolved_text(followup: Followup, text: str) -> str:
    """What ``resolve`` scores: the anchor's snippet (the compact history's, nothing more)
    and the query."""
    return f"{followup.anchor.snippet.rstrip('…')} {text}"


def pick(alone: Layer2Result, resolved: Layer2Result) -> Layer2Result:
    """The answer for a follow-up scored both ways: the resolved score, unless layer 2 is sure
    of the query alone in scope and the previous turn's snippet makes it unsure (then the
    query's own words decide; on the benchmark's dev sessions this and "always resolved"
    answer the same)."""
    if alone.sure and alone.label is not None and not resolved.sure:
        return alone
    return resolved


def never_sure_oos(res: Layer2Result, why: str) -> Layer2Result:
    """``res`` with an out-of-scope answer made unsure: layer 2's best in-scope candidate as a
    ``weak`` answer the teacher is asked about (``why`` leads the reason). A follow-up leans on
    an in-scope turn, so the gate's "out of scope" is no evidence; other answers are kept."""
    if res.label is not None or not res.candidates:
        return replace(res, reason=f"{why}; {res.reason}")
    top = res.candidates[0]
    return replace(res, label=top.label, confidence=top.confidence, tier=Tier.WEAK, sure=False,
                   alternatives=list(res.candidates[:3]),
                   reason=f"{why}; not sure out of scope ({res.reason})")


def followup_results(mode: str, detector: FollowupDetector, texts: Sequence[str],
                     histories: Sequence[Sequence[HistoryEntry]], alone: Sequence[Layer2Result],
                     score: Callable[[list[str]], list[Layer2Result]]
                     ) -> list[tuple[Layer2Result, Followup | None]]:
    """Layer 2's results for a batch under ``mode`` (``resolve``, ``defer`` or ``off``), with the
    follow-up each query is (``None``: scored alone, its result ``alone`` unchanged).

    A follow-up is scored with its anchor's snippet (``score``: one encoder pass for every
    resolved text of the batch; :func:`pick`), never a sure out-of-scope answer
    (:func:`never_sure_oos`); under ``defer`` it is never sure at all: the teacher reads the
    history, and the resolved answer is the fallback when it cannot be asked."""
    found = [detector.detect(t, h) if mode != "off" else None for t, h in zip(texts, histories)]
    out: list[tuple[Layer2Result, Followup | None]] = [(a, f) for a, f in zip(alone, found)]
    todo = [j for j, f in enumerate(found) if f is not None]
    if not todo:
        return out
    resolved = score([resolved_text(f, texts[j]) for j in todo if (f := found[j]) is not None])
    for j, res in zip(todo, resolved):
        f = found[j]
        assert f is not None
        chosen = pick(alone[j], res)
        how = "resolved with its snippet" if chosen is res else "its own words decide"
        if mode == "defer":
            how += ", deferred to the teacher with the history"
        chosen = never_sure_oos(chosen, f"{f.describe()}: {how}")
        out[j] = (replace(chosen, sure=False) if mode == "defer" else chosen, f)
    return out
