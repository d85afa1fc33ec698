"""The command line's machine-readable output: one JSON object per line on stdout.

Every ``--json`` and every decision that ``flywheel`` prints goes through :func:`echo_json`,
so all commands agree on the encoding (UTF-8 kept as is, values JSON cannot hold as
strings) and flush per line for pipes. :func:`counted` writes a count with its noun for
the human-readable lines ("1 decision", "2 decisions").
"""

from __future__ import annotations

import json
import sys

__all__ = ["counted", "echo_json"]


def echo_json(obj: object) -> None:
    """Write ``obj`` as one JSON line on stdout and flush."""
    sys.stdout.write(json.dumps(obj, ensure_ascii=False, default=str) + "\n")
    sys.stdout.flush()


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` with thousands separators and ``noun``, in the plural (``plural``, else
    ``noun + "s"``) unless ``n`` is 1: ``counted(1, "decision")`` is ``"1 decision"``."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"
