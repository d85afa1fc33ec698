"""The models home's policy, stated once for both registries: which versions a prune
keeps, what its history becomes, and which version a rollback serves.

:class:`classifier.versions.registry.ModelRegistry` (a local models home: ``CURRENT`` and
``HISTORY`` files) and :class:`fleet.registry.BucketRegistry` (a bucket: one ``CURRENT``
object with its history) differ in how they read and swap their pointers, never in
these rules. Pure functions: names in, names out.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from flywheel.classifier.errors import InvalidInputError

__all__ = ["check_keep_counts", "history_without", "prune_plan", "rollback_target", "versions_to_keep"]


def check_keep_counts(keep_promoted: Any, keep_recent: Any) -> None:
    """:class:`InvalidInputError` unless both of a prune's keep counts are integers >= 0."""
    for arg, value in (("keep_promoted", keep_promoted), ("keep_recent", keep_recent)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidInputError(f"{arg} must be an integer >= 0, got {value!r}")
        if value < 0:
            raise InvalidInputError(f"{arg} must be >= 0, got {value}")


def versions_to_keep(names: Sequence[str], history: Sequence[str], *, served: str | None, shadow: str | None,
                     keep_promoted: int, keep_recent: int) -> set[str]:
    """The versions a prune keeps: the served one and the shadow, always; the last
    ``keep_promoted`` entries of the promotion ``history`` (so a rollback works that far
    back); and the ``keep_recent`` newest of ``names`` (oldest first), promoted or not."""
    check_keep_counts(keep_promoted, keep_recent)
    keep = set(names[-keep_recent:]) if keep_recent else set()
    if keep_promoted:
        keep.update(history[-keep_promoted:])
    keep.update(n for n in (served, shadow) if n is not None)
    return keep


def prune_plan(names: Sequence[str], history: Sequence[str], *, served: str | None, shadow: str | None,
               keep_promoted: int, keep_recent: int) -> list[str]:
    """The versions a prune removes, in the order of ``names`` (oldest first)."""
    keep = versions_to_keep(names, history, served=served, shadow=shadow, keep_promoted=keep_promoted,
                            keep_recent=keep_recent)
    return [n for n in names if n not in keep]


def history_without(history: Sequence[str], gone: Iterable[str]) -> list[str]:
    """The promotion history once the ``gone`` versions are deleted: their entries dropped,
    and an entry that now repeats the one before it merged (a rollback never steps onto
    the version already served)."""
    gone = set(gone)
    kept = [n for n in history if n not in gone]
    return [n for i, n in enumerate(kept) if i == 0 or kept[i - 1] != n]


def rollback_target(history: Sequence[str], current: str | None) -> tuple[str, list[str]] | None:
    """Where a rollback goes: ``(version, history)``, the previously promoted version and the
    history that then ends with it (the served version's trailing entries dropped); ``None``
    when there is nothing to roll back to."""
    hist = list(history)
    while hist and hist[-1] == current:
        hist.pop()
    return (hist[-1], hist) if hist else None
