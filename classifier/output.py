"""The command line's machine-readable output: one JSON object per line on stdout.

Every ``--json`` and every decision that ``flywheel`` prints goes through :func:`echo_json`,
so all commands agree on the encoding (UTF-8 kept as is, values JSON cannot hold as
strings) and flush per line for pipes.
"""

from __future__ import annotations

import json
import sys

__all__ = ["echo_json"]


def echo_json(obj: object) -> None:
    """Write ``obj`` as one JSON line on stdout and flush."""
    sys.stdout.write(json.dumps(obj, ensure_ascii=False, default=str) + "\n")
    sys.stdout.flush()
