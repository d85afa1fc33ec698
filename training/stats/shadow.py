"""The ``shadow`` section of ``flywheel stats``: how a shadow model version, scored beside
the served ("champion") version on live layer-2 traffic (:mod:`classifier.shadow`), would
have done.

Rows: the shadow's answers are ``labels`` rows with ``source = 'shadow'`` and ``model`` =
the version (``label`` NULL = out of scope, ``sure``: it would have decided without the
teacher). Only decisions that are in the log and have an answer of that version count:
exactly the layer-2 queries the shadow scored. A decision with several answers of the
version (should not happen: a row shipped twice is counted once by ``label_uid``) counts
once, with its latest answer (``created_at``, then ``label_id``).

Per decision:

- champion sure: layer 2 decided alone (``layer = 'embedding' AND degraded IS NULL``);
  unsure: it went to the teacher (``layer = 'llm'``) or should have (``degraded`` set).
  A champion that is sure served its layer-2 label (``decisions.label``).
- shadow sure: the answer's ``sure`` (NULL reads as unsure).
- kind: ``permissive`` (shadow sure, champion not), ``abstaining`` (champion sure, shadow
  not), ``flips`` (both sure, different labels; out of scope equals out of scope), else
  agreeing: same label when both are sure, and also *both unsure* (both would have asked
  the teacher, whatever their own labels), so ``agree = n - permissive - abstaining - flips``.
- reference label: the latest human label if any, else the latest valid teacher label
  (the ``decision_labels`` view), ``NULL`` = out of scope; a decision with neither is
  unlabelled.

``on_disagreements`` (the permissive, abstaining and flipped rows): ``n``, ``n_labelled``
(those with a reference label) and the accuracy of each side on the labelled ones:
``champion_accuracy`` compares the champion's *served* label (``decisions.label``: what
the user got, the teacher's when it answered) with the reference, ``shadow_accuracy`` the
shadow's label; ``None`` when nothing is labelled. ``llm_share``: the share of the ``n``
decisions on which the champion was unsure (went to the teacher), and on which the shadow
would have been (the LLM share it would have had). Shares are rounded to 6 digits;
``first``/``last`` are the times of the first and last counted shadow answers (ISO 8601 UTC
ending in ``Z``).

Range: the whole log, like the totals and the anchoring section of
:func:`training.stats.traffic.convergence`, read by one more statement
(:meth:`~logstore.reads.NamedReads.shadow_agreement`; a decision logged between two
statements may be counted in one and not the other).
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from flywheel.logstore.reads import LogReader

__all__ = ["count_shadow", "empty_shadow", "format_shadow", "shadow_section"]


def _share(k: int, n: int) -> float | None:
    return round(k / n, 6) if n else None


def _iso(ts: datetime | None) -> str | None:
    return None if ts is None else ts.isoformat(timespec="seconds") + "Z"


def count_shadow(store: "LogReader", version: str) -> int:
    """How many decisions in the log shadow ``version`` answered (a decision answered twice
    counts once, as ``n`` in :func:`shadow_section`): what ``promote --from-shadow`` checks."""
    return store.shadow_answered(version)


def _section(version: str, n: int, permissive: int, abstaining: int, flips: int, n_dis_labelled: int,
             champion_right: int, shadow_right: int, champion_unsure: int, shadow_unsure: int,
             first: datetime | None, last: datetime | None) -> dict[str, Any]:
    agree = n - permissive - abstaining - flips
    return {
        "version": version,
        "n": n,
        "agree": agree,
        "permissive": permissive,
        "abstaining": abstaining,
        "flips": flips,
        "agreement": _share(agree, n),
        "on_disagreements": {
            "n": permissive + abstaining + flips,
            "n_labelled": n_dis_labelled,
            "champion_accuracy": _share(champion_right, n_dis_labelled),
            "shadow_accuracy": _share(shadow_right, n_dis_labelled),
        },
        "llm_share": {"champion": _share(champion_unsure, n), "shadow": _share(shadow_unsure, n)},
        "first": _iso(first),
        "last": _iso(last),
    }


def shadow_section(store: "LogReader", version: str | None) -> dict[str, Any] | None:
    """``flywheel stats``' ``shadow``: shadow ``version`` against the champion over the
    whole log (definitions in the module docstring); ``None`` when ``version`` is ``None``.

    Keys: ``version``, ``n``, ``agree``, ``permissive``, ``abstaining``, ``flips``,
    ``agreement`` (``agree / n``; note that both sides unsure counts as agreeing: both would
    have asked the teacher), ``on_disagreements`` (``n``, ``n_labelled``,
    ``champion_accuracy`` of the champion's served label, ``shadow_accuracy``),
    ``llm_share`` (``champion``, ``shadow``), ``first``, ``last``.
    """
    if version is None:
        return None
    a = store.shadow_agreement(version)
    return _section(version, a.n, a.permissive, a.abstaining, a.flips, a.disagreements_labelled, a.champion_right,
                    a.shadow_right, a.champion_unsure, a.shadow_unsure, a.first, a.last)


def empty_shadow(version: str) -> dict[str, Any]:
    """The ``shadow`` section of ``version`` on an empty or missing log."""
    return _section(version, 0, 0, 0, 0, 0, 0, 0, 0, 0, None, None)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100.0 * x:.1f}%"


def format_shadow(section: dict[str, Any]) -> str:
    """One or two lines for the terminal table, e.g. ``shadow v2: agrees with the champion
    on 7/10 70.0% (1 permissive, 1 abstaining, 1 flipped); LLM share 40.0% -> 30.0%`` and
    ``on the 3 disagreements, 2 labelled: champion right 50.0%, shadow right 100.0%``."""
    s = section
    if not s["n"]:
        return f"shadow {s['version']}: no answers in the log yet"
    line = (f"shadow {s['version']}: agrees with the champion on {s['agree']}/{s['n']} {_pct(s['agreement'])} "
            f"({s['permissive']} permissive, {s['abstaining']} abstaining, {s['flips']} flipped); "
            f"LLM share {_pct(s['llm_share']['champion'])} -> {_pct(s['llm_share']['shadow'])}")
    d = s["on_disagreements"]
    if not d["n"]:
        return line
    if not d["n_labelled"]:
        return line + f"\n  on the {d['n']} disagreements, none labelled yet"
    return line + (f"\n  on the {d['n']} disagreements, {d['n_labelled']} labelled: champion right "
                   f"{_pct(d['champion_accuracy'])}, shadow right {_pct(d['shadow_accuracy'])}")
