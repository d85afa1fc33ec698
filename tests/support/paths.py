"""Where things are, for tests at any depth under tests/: ``ROOT`` (the repository),
``TESTS`` (tests/) and ``DATA`` (tests/data/, the held-out queries and the nonsense list)."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
DATA = TESTS / "data"
