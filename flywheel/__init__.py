"""flywheel: an intent classifier for LLM applications that gets cheaper the longer it runs.

>>> from flywheel import classify, open_classifier               # doctest: +SKIP
>>> d = classify("What is addVar in AVAP?")                      # doctest: +SKIP
>>> d.label, d.tier.value                                        # doctest: +SKIP
('RETRIEVAL', 'confident')
>>> with open_classifier() as clf:                               # doctest: +SKIP
...     clf.classify("and make it shorter", session_id="s1")

The entry (:mod:`flywheel.api`): :func:`classify` classifies with the configured model and
logs the decision to the traffic log, so that ``flywheel retrain`` learns from it, as
``flywheel classify`` and the sidecar do; it opens one classifier for the process on first
use and closes it at exit (:func:`close` closes it now). :func:`open_classifier` opens one of
your own (a :class:`LoggedClassifier`: a context manager that follows promotions and flushes
the log when it closes). ``import flywheel`` alone loads neither a model nor the log: these
names are imported on first use.

The distribution is ``flywheel-intent``; everything it installs lives under this one
namespace: :mod:`flywheel.classifier` (runtime), :mod:`flywheel.logstore` (traffic log),
:mod:`flywheel.fleet` (object storage), :mod:`flywheel.service` (serving),
:mod:`flywheel.training` (offline) and :mod:`flywheel.cli` (the ``flywheel`` command).

A source checkout keeps those rooms as folders at the repository root and links each
into this folder (``flywheel/classifier -> ../classifier``, committed as a symlink), so
``flywheel.classifier`` is ``flywheel/classifier/`` in a checkout, in the wheel and to
any static reader alike; nothing here extends the import system.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flywheel.api import LoggedClassifier, classify, close, open_classifier

__all__ = ["LoggedClassifier", "classify", "close", "open_classifier"]


def __getattr__(name: str) -> object:
    """The entry's names, imported from :mod:`flywheel.api` on first use (PEP 562)."""
    if name in __all__:
        from flywheel import api

        return getattr(api, name)
    raise AttributeError(f"module 'flywheel' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
