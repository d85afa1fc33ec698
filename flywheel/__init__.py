"""flywheel: an intent classifier for LLM applications that gets cheaper the longer it runs.

The distribution is ``flywheel-intent``; everything it installs lives under this one
namespace: :mod:`flywheel.classifier` (runtime), :mod:`flywheel.logstore` (traffic log),
:mod:`flywheel.fleet` (object storage), :mod:`flywheel.service` (serving),
:mod:`flywheel.training` (offline) and :mod:`flywheel.cli` (the ``flywheel`` command).

The wheel places those packages under ``flywheel/`` (``package-dir`` in pyproject.toml).
A source checkout keeps them as folders at the repository root, so there this package's
``__path__`` also names the root: ``flywheel.classifier`` is ``<root>/classifier`` in
both. Only a checkout (a ``pyproject.toml`` that names this distribution beside the
folders) gets the extra entry; an installed wheel never looks outside its own folder.
"""

from __future__ import annotations

import os as _os

_ROOT = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))


def _is_checkout(root: str) -> bool:
    # a stat first: an installed wheel (no classifier/ beside flywheel/) reads no file
    if not _os.path.isfile(_os.path.join(root, "classifier", "__init__.py")):
        return False
    try:
        with open(_os.path.join(root, "pyproject.toml"), encoding="utf-8") as fh:
            return 'name = "flywheel-intent"' in fh.read()
    except OSError:
        return False


if _is_checkout(_ROOT) and _ROOT not in __path__:
    __path__.append(_ROOT)
