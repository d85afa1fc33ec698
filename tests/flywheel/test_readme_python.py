"""README.md's first Python example, run as written: it classifies with the embedded default
model (the starter set, trained on first use in the test's home: nothing is downloaded) and
every decision it makes is in the traffic log afterwards, found by id and by text."""

from __future__ import annotations

import re

import pytest

import flywheel
from flywheel.classifier.settings.config import load_config
from flywheel.logstore import LogStore
from tests.support.paths import ROOT

pytestmark = pytest.mark.slow   # trains the starter set

_FENCE = re.compile(r"^```python\n(.*?)^```", re.M | re.S)
_CLASSIFIED = re.compile(r"""classify(?:_many)?\((\[[^\]]*\]|"[^"]*")""")


def readme_python_example() -> str:
    """The first ``python`` code block of README.md's "## Python" section."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Python\n", 1)[1].split("\n## ", 1)[0]
    found = _FENCE.search(section)
    assert found, "README.md's Python section has no python code block"
    return found.group(1)


def test_the_readme_python_example_feeds_the_log():
    code = readme_python_example()
    assert "flywheel.classify(" in code and "open_classifier(" in code
    texts = [t for arg in _CLASSIFIED.findall(code) for t in re.findall(r'"([^"]*)"', arg)]
    assert "What is addVar in AVAP?" in texts and len(texts) >= 4
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)   # noqa: S102 - the README's own example
    d = namespace["d"]
    assert d.label == "RETRIEVAL"
    flywheel.close()   # what the end of the process does (atexit): flushes the log
    store = LogStore(load_config().log_path)
    rows = store.query("SELECT text, label FROM decisions WHERE decision_id = ?", [d.id])
    assert rows == [("What is addVar in AVAP?", "RETRIEVAL")]
    logged = [t for (t,) in store.query("SELECT text FROM decisions")]
    assert sorted(logged) == sorted(texts)   # every query the example classifies, once
