"""The ``by_language`` section of ``flywheel stats``: how each language's traffic fares.

One row per logged language (``decisions.language``, migration 6: one of the intent set's
declared ``languages`` or ``unknown``; ``none`` for rows logged before the column), over
the whole log like the totals of :func:`training.stats.traffic.convergence`, read by its
own statement (:meth:`~logstore.reads.NamedReads.language_breakdown`): ``n`` and ``share``
of the decisions, ``llm_share`` (the teacher decided), ``confident_share``,
``degraded_share``, ``out_of_scope_share`` (served out of scope), and layer 2 against the
teacher: ``l2_judged`` decisions with both layer 2's answer and a teacher label (the
``decision_labels`` view), ``l2_agreement`` the share of those where they agree (``None``
when none is judged). The dashboard (:mod:`training.review.dashboard`) shows the same section.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from flywheel.logstore.reads import LogReader

__all__ = ["format_languages", "language_section"]


def _share(k: int, n: int) -> float:
    return round(k / n, 6) if n else 0.0


def language_section(store: "LogReader") -> dict[str, dict[str, Any]]:
    """``{language: {n, share, llm_share, confident_share, degraded_share, out_of_scope_share,
    l2_judged, l2_agreement}}``, largest first."""
    rows = store.language_breakdown()
    total = sum(r.n for r in rows)
    return {str(lang): {"n": int(n), "share": _share(n, total), "llm_share": _share(llm, n),
                        "confident_share": _share(conf, n), "degraded_share": _share(deg, n),
                        "out_of_scope_share": _share(oos, n),
                        "l2_judged": int(judged), "l2_agreement": round(agree / judged, 6) if judged else None}
            for lang, n, llm, conf, deg, judged, agree, oos in rows}


def format_languages(section: dict[str, dict[str, Any]]) -> list[list[str]]:
    """The section as table rows: language, n, share, LLM, confident, degraded, layer 2 vs teacher."""
    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.1f}%"

    return [[lang, f"{s['n']:,}", pct(s["share"]), pct(s["llm_share"]), pct(s["confident_share"]),
             pct(s["degraded_share"]), f"{pct(s['l2_agreement'])} of {s['l2_judged']}"]
            for lang, s in section.items()]
