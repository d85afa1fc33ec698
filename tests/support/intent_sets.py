"""Two versions of one deployment's intent set, for the deployment contract's tests (issue 41).

- :data:`OLD_DOC`: :data:`~tests.support.docs.DOC` plus ``OPENING_HOURS``, the set a shop
  served first; :data:`NEW_DOC`: the same file after the shop removed ``OPENING_HOURS``.
- :func:`write_doc`, :func:`save_fitted`: the intent file on disk, and a version of a set
  saved into a models home (on the tests' hash encoder).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from flywheel.classifier.layer2.fitter import fit_model
from flywheel.classifier.settings.intents import parse_intents
from flywheel.classifier.versions.model import IntentModel
from flywheel.classifier.versions.registry import ModelRegistry
from tests.support.docs import ALWAYS_SURE, DOC
from tests.support.fakes import HashEmbedder

OPENING_HOURS = {"name": "OPENING_HOURS", "description": "when the shop is open",
                 "examples": ["when do you open", "opening hours on sunday", "are you open now",
                              "what time do you close", "holiday opening times", "open on saturday"]}

NEW_DOC: dict[str, Any] = {**copy.deepcopy(DOC), "thresholds": dict(ALWAYS_SURE)}
OLD_DOC: dict[str, Any] = {**copy.deepcopy(NEW_DOC), "intents": [*copy.deepcopy(DOC["intents"]), OPENING_HOURS]}


def write_doc(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def fitted(doc: dict[str, Any], version: str, embedder: Any = None) -> IntentModel:
    return fit_model(parse_intents(doc), embedder=embedder or HashEmbedder(), version=version)


def save_fitted(reg: ModelRegistry, doc: dict[str, Any], *names: str) -> None:
    """Save a version of ``doc`` into ``reg`` under each of ``names`` (not promoted)."""
    for name in names:
        fitted(doc, name).save(reg.version_dir(name))
