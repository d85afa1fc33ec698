"""Commands beyond classify/train, registered on the typer app by :func:`register`."""

from __future__ import annotations

import typer

_done = False


def register(app: typer.Typer) -> None:
    global _done
    if _done:
        return
    _done = True
