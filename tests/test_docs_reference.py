"""docs/reference/configuration.md against the code: it names every config-file key, every
environment variable and every intent-file key the code reads, and nothing else, so the
reference cannot drift.

What the code reads is collected from the code itself: the config file's keys are
:class:`~flywheel.classifier.settings.config.Config`'s fields (those ``load_config`` accepts
in a file), the environment variables every ``FLYWHEEL_*``, ``AWS_*``, ``OLLAMA_HOST`` and
``OPENAI_API_KEY`` name in the library's source, and the intent file's keys the key sets
``classifier/settings/intents.py`` validates each section with (``_TOP_KEYS``,
``_EMBEDDER_KEYS``, ...). The page is read as Markdown: the first cell of each table row in
the "Config file", "Environment variables" and "Intent file" sections.
"""

from __future__ import annotations

import re
from dataclasses import fields

from flywheel.classifier.layer2.targets import TARGET_KINDS
from flywheel.classifier.settings import intents as intent_file
from flywheel.classifier.settings.config import ENV, Config
from tests.support.paths import ROOT

PAGE = ROOT / "docs" / "reference" / "configuration.md"
LIBRARY = ("classifier", "logstore", "fleet", "service", "training", "flywheel")
_ENV_NAME = re.compile(r"\b(?:FLYWHEEL_[A-Z0-9_]+|AWS_[A-Z0-9_]+|OLLAMA_HOST|OPENAI_API_KEY)\b")
_SPAN = re.compile(r"`([^`]+)`")


def sections(markdown: str) -> dict[str, str]:
    """``## Heading`` -> its text (up to the next ``## ``), ``###`` subsections included."""
    out: dict[str, str] = {}
    for part in re.split(r"^## ", markdown, flags=re.M)[1:]:
        heading, _, body = part.partition("\n")
        out[heading.strip()] = body
    return out


def first_cells(section: str) -> list[set[str]]:
    """The code spans in the first cell of each table row (header and rule rows skipped)."""
    rows = []
    for line in section.splitlines():
        if not line.startswith("|") or re.fullmatch(r"\|[-|: ]+\|", line.strip()):
            continue
        cells = line.strip().strip("|").split("|")
        spans = set(_SPAN.findall(cells[0]))
        if spans:
            rows.append(spans)
    return rows


def documented(section: str) -> set[str]:
    return set().union(*first_cells(section))


def page_sections() -> dict[str, str]:
    return sections(PAGE.read_text(encoding="utf-8"))


# ----------------------------------------------------------------------------- the code
def config_file_keys() -> set[str]:
    """What ``load_config`` accepts in a config file (the home is not one: the file lives in it)."""
    return {f.name for f in fields(Config)} - {"sources", "home"}


def environment_variables() -> set[str]:
    """Every environment variable the library names: its source files' ``FLYWHEEL_*``,
    ``AWS_*``, ``OLLAMA_HOST`` and ``OPENAI_API_KEY``, and the settings' ``ENV`` map."""
    found = set(ENV.values())
    for room in LIBRARY:
        base = ROOT / room
        paths = [p for p in base.rglob("*.py")] if room != "flywheel" else list(base.glob("*.py"))
        for path in paths:
            found |= set(_ENV_NAME.findall(path.read_text(encoding="utf-8")))
    return found


def intent_file_keys() -> set[str]:
    """Every key an intent file may hold, dotted (``embedder.tune.budget_s``; a list's
    items as ``intents[].name``), from the sets ``parse_intents`` checks each section with."""
    m = intent_file
    keys = set(m._TOP_KEYS)
    keys |= {f"intents[].{k}" for k in m._INTENT_KEYS}
    keys |= {f"intents[].thresholds.{k}" for k in m._PER_INTENT_KEYS}
    keys |= {f"rules[].{k}" for k in m._RULE_KEYS}
    keys |= {f"out_of_scope.{k}" for k in m._OOS_KEYS}
    keys |= {f"embedder.{k}" for k in m._EMBEDDER_KEYS}
    keys |= {f"embedder.tune.{k}" for k in m._TUNE_KEYS}
    keys |= {f"teacher.{k}" for k in m._TEACHER_KEYS}
    keys |= {f"thresholds.{k}" for k in m._THRESHOLD_KEYS}
    keys |= {f"thresholds.target.{k}" for k in TARGET_KINDS}
    return keys


def diff(what: str, on_page: set[str], in_code: set[str]) -> list[str]:
    problems = [f"{what}: the code reads {k!r}, the reference does not list it" for k in sorted(in_code - on_page)]
    problems += [f"{what}: the reference lists {k!r}, which the code does not read" for k in sorted(on_page - in_code)]
    return problems


# ----------------------------------------------------------------------------- tests
def test_the_reference_lists_every_config_file_key_and_its_variable():
    section = page_sections()["Config file"]
    rows = first_cells(section)
    assert not diff("config file", documented(section), config_file_keys()), \
        "\n".join(diff("config file", documented(section), config_file_keys()))
    # each row's second column names the key's environment variable, as load_config reads it
    for line in section.splitlines():
        cells = line.strip().strip("|").split("|")
        key = _SPAN.findall(cells[0]) if line.startswith("|") else []
        if len(key) == 1 and key[0] in config_file_keys():
            assert _SPAN.findall(cells[1]) == [ENV[key[0]]], line
    assert len(rows) == len(config_file_keys())   # one row per key


def test_the_reference_lists_every_environment_variable():
    sec = page_sections()
    problems = diff("environment", documented(sec["Environment variables"]), environment_variables())
    assert not problems, "\n".join(problems)
    # and no variable named anywhere on the page is one the code does not read
    named = set(_ENV_NAME.findall(PAGE.read_text(encoding="utf-8")))
    assert named <= environment_variables(), sorted(named - environment_variables())


def test_the_reference_lists_every_intent_file_key():
    problems = diff("intent file", documented(page_sections()["Intent file"]), intent_file_keys())
    assert not problems, "\n".join(problems)


def test_the_check_finds_what_is_missing_and_what_is_invented():
    page = "\n".join([
        "## Config file", "| key | env | x |", "|---|---|---|", "| `model` | `FLYWHEEL_MODEL` | x |",
        "| `no_such_key` | | x |",
        "## Intent file", "| key | default |", "|---|---|", "| `embedder.backend` | `auto` |",
    ])
    sec = sections(page)
    config = diff("config file", documented(sec["Config file"]), config_file_keys())
    assert "config file: the reference lists 'no_such_key', which the code does not read" in config
    assert "config file: the code reads 'intents', the reference does not list it" in config
    intents = diff("intent file", documented(sec["Intent file"]), intent_file_keys())
    assert "intent file: the code reads 'teacher.cache_size', the reference does not list it" in intents
    assert not any("embedder.backend" in p for p in intents)
    expected = {"FLYWHEEL_HOME", "FLYWHEEL_ONNX_CACHE", "OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY"}
    assert expected <= environment_variables()
