"""An intent file's operating-point target (``thresholds.target``), checked: the standard
library only, so :mod:`classifier.settings.intents` reads it without importing the scoring code
(:mod:`classifier.layer2.operating_point` finds the cutoff a target names)."""

from __future__ import annotations

from typing import Any

__all__ = ["TARGET_KINDS", "check_target", "target_kind", "threshold_target"]

TARGET_KINDS = ("oos_recall", "llm_share", "precision")
_RANGES = {"oos_recall": (0.0, 1.0, "(0, 1]"), "llm_share": (0.0, 1.0, "[0, 1)"), "precision": (0.0, 1.0, "(0, 1]")}


def check_target(value: Any) -> dict[str, float] | None:
    """A target as ``{kind: value}`` (``None`` stays ``None``); :class:`ValueError` with
    one line saying what is wrong: not a mapping, an unknown key, not exactly one key, or a
    value out of its range (``oos_recall`` and ``precision`` in (0, 1], ``llm_share`` in [0, 1)).

    Examples
    --------
    >>> check_target({"oos_recall": 0.85})
    {'oos_recall': 0.85}
    >>> check_target({"oos_recall": 0.85, "llm_share": 0.1})
    Traceback (most recent call last):
    ...
    ValueError: give exactly one of oos_recall, llm_share, precision (got llm_share, oos_recall)
    """
    if value is None:
        return None
    kinds = ", ".join(TARGET_KINDS)
    if not isinstance(value, dict):
        raise ValueError(f"must be a mapping with one of {kinds} (e.g. {{oos_recall: 0.85}}), got {value!r}")
    unknown = sorted(str(k) for k in value if k not in TARGET_KINDS)
    if unknown:
        raise ValueError(f"unknown key {unknown[0]!r}: give one of {kinds}")
    if len(value) != 1:
        raise ValueError(f"give exactly one of {kinds} (got {', '.join(sorted(value)) or 'none'})")
    (kind, v), = value.items()
    lo, hi, shown = _RANGES[kind]
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and \
        (lo <= v < hi if kind == "llm_share" else lo < v <= hi)
    if not ok:
        raise ValueError(f"{kind} must be a number in {shown}, got {v!r}")
    return {kind: float(v)}


def threshold_target(th: dict[str, Any]) -> dict[str, float] | None:
    """An intent file's ``thresholds`` section's ``target``, checked (:func:`check_target`):
    its ``precision`` is ``target_precision`` by another name (the two cannot differ), and
    it cannot move a cutoff the section fixes (``oos`` for a recall, ``confident`` for a share)."""
    target = check_target(th.get("target"))
    kind = target_kind(target)
    fixed = {"oos_recall": "oos", "llm_share": "confident"}.get(kind or "")
    given = th.get("target_precision")
    if kind == "precision" and isinstance(given, (int, float)) and float(given) != (target or {})[kind]:
        raise ValueError("precision is thresholds.target_precision by another name: give one of them")
    if fixed and th.get(fixed) is not None:
        raise ValueError(f"{kind} sets the {fixed} cutoff, which thresholds.{fixed} fixes: give one of them")
    return target


def target_kind(target: dict[str, float] | None) -> str | None:
    """The target's one key (``None`` without a target)."""
    return next(iter(target)) if target else None
