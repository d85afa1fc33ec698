"""``flywheel review`` and ``flywheel ui``: walk the review queue (:mod:`training.review`) in the terminal, one
keystroke per label, or print it as JSON.

Keys: ``1``-``9`` pick the numbered intent, ``o`` out of scope, ``s`` skip, ``u`` undo the
last label, ``q`` quit. A label is a human label (``flywheel feedback``'s, so it wins at
the next retrain); it is written when the next key is read, so that ``u`` can take it back
without a second label in the log, and on quit or end of input.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Optional

import typer

from flywheel.classifier.config import HOME_HELP, load_config
from flywheel.classifier.label_names import OUT_OF_SCOPE, label_name
from flywheel.classifier.output import echo_json
from flywheel.training.review import REASONS, ReviewFilters, ReviewItem

__all__ = ["Reviewer", "review_command", "ui_command"]

KEYS_HELP = "1-9 pick, o out of scope, s skip, u undo, q quit"


@dataclass
class Reviewer:
    """The review walk as a state machine over ``items``: :meth:`press` takes one key and
    returns what to tell the person. ``write(decision_id, label)`` stores a human label
    (``None`` = out of scope). The last label is held back until the next key (``u``
    drops it and goes back to its item) and written by :meth:`close`."""

    items: Sequence[ReviewItem]
    write: Callable[[str, str | None], None]
    position: int = 0
    labelled: int = 0
    skipped: int = 0
    _held: tuple[int, str | None] | None = field(default=None, repr=False)

    @property
    def done(self) -> bool:
        return self.position >= len(self.items)

    @property
    def current(self) -> ReviewItem | None:
        return None if self.done else self.items[self.position]

    def press(self, key: str) -> str:
        """Apply one key; returns a one-line message."""
        if key == "u":
            if self._held is None:
                return "nothing to undo"
            self.position, _ = self._held
            self._held = None
            self.labelled -= 1
            return "undone"
        if self.done:
            return "the queue is done"
        item = self.items[self.position]
        if key == "s":
            self._flush()
            self.skipped += 1
            self.position += 1
            return "skipped"
        if key == "o":
            return self._label(None)
        if key.isdigit() and 1 <= int(key) <= len(item.choices):
            return self._label(item.choices[int(key) - 1])
        return f"unknown key {key!r} ({KEYS_HELP})"

    def _label(self, label: str | None) -> str:
        self._flush()
        self._held = (self.position, label)
        self.labelled += 1
        self.position += 1
        return f"labelled {label_name(label)}"

    def _flush(self) -> None:
        if self._held is not None:
            index, label = self._held
            self._held = None
            self.write(self.items[index].decision_id, label)

    def close(self) -> None:
        """Write the label still held back."""
        self._flush()


def show(item: ReviewItem, index: int, total: int) -> str:
    """The lines a person reads for one item (plain text: a terminal shows no markup)."""
    conf = "" if item.confidence is None else f" ({item.confidence:.2f})"
    lines = [f"[{index + 1}/{total}] {item.text!r}",
             f"  served {label_name(item.label)}{conf} by {item.layer}; why: {', '.join(item.reasons)}"]
    if item.teacher_label is not None or item.candidates:
        said = ", ".join(label_name(c) for c in item.candidates) if item.candidates \
            else label_name(item.teacher_label)
        lines.append(f"  teacher: {said}")
    if item.shadow_label is not None:
        lines.append(f"  shadow: {label_name(item.shadow_label)}")
    lines.append("  " + "  ".join(f"{i}) {label_name(c)}" for i, c in enumerate(item.choices, 1))
                 + f"  o) {OUT_OF_SCOPE}")
    return "\n".join(lines)


def review_command(
    as_json: bool = typer.Option(False, "--json", help="Print the queue as JSON and label nothing."),
    limit: int = typer.Option(50, "--limit", min=1, help="Items in the queue."),
    intent: Optional[str] = typer.Option(None, "--intent", help="Only decisions about this intent."),
    tier: Optional[str] = typer.Option(None, "--tier", help="Only this served tier."),
    layer: Optional[str] = typer.Option(None, "--layer", help="Only this layer (rules, embedding, llm)."),
    reason: Optional[List[str]] = typer.Option(None, "--reason", help=f"Only these reasons: {', '.join(REASONS)}."),
    min_confidence: Optional[float] = typer.Option(None, "--min-confidence",
                                                   help="Only decisions served with at least this confidence."),
    max_confidence: Optional[float] = typer.Option(None, "--max-confidence",
                                                   help="Only decisions served with at most this confidence."),
    days: Optional[float] = typer.Option(None, "--days", min=0.0, help="Only the last N days."),
    author: Optional[str] = typer.Option(None, "--author", help="Who labels (kept with each label)."),
    export_ls: Optional[Path] = typer.Option(
        None, "--export-label-studio", help="Write the queue as Label Studio tasks (JSON, the served answer as a "
                                            "pre-annotation) and the project's labeling config beside it (.xml)."),
    import_ls: Optional[Path] = typer.Option(
        None, "--import-label-studio", help="Read Label Studio's JSON export and record its annotations as human "
                                            "labels (checked whole first: a malformed task writes nothing)."),
    log_db: Optional[str] = typer.Option(None, "--log-db", help="Traffic log DuckDB file."),
    home: Optional[Path] = typer.Option(None, "--home", help=HOME_HELP),
) -> None:
    """Review the decisions most worth a label: one keystroke each; the labels win at the next retrain."""
    import time

    from flywheel.training.review import review_queue

    cfg, store, write, fleet = _open_review(home, log_db, author)
    if import_ls is not None:
        # locally every decision must be in the log before anything is written; a fleet's labels
        # may name a decision another replica has not shipped yet (checked at retrain)
        _import_label_studio(import_ls, cfg, write, author, None if fleet else store.has_decision)
        return
    filters = ReviewFilters(intent=intent, tier=tier, layer=layer, reasons=tuple(reason or ()),
                            min_confidence=min_confidence, max_confidence=max_confidence,
                            since=None if days is None else time.time() - days * 86_400)
    from flywheel.training.feedback import known_labels

    items = review_queue(store, filters, limit=limit, labels=known_labels(cfg))
    if export_ls is not None:
        _export_label_studio(export_ls, items, cfg)
        return
    if as_json:
        echo_json({"items": [it.to_dict() for it in items], "n": len(items)})
        return
    walk(Reviewer(items, write))


def _open_review(home: Optional[Path], log_db: Optional[str], author: Optional[str]
                 ) -> tuple[Any, Any, Callable[..., None], bool]:
    """``(config, log, write, fleet)`` for the review commands: the log (mirrored in fleet
    mode) and ``write(decision_id, label, who=author)``, which records a human label the way
    ``flywheel feedback`` does (through the fleet's labels in fleet mode, so it ships)."""
    from flywheel.fleet.site import open_site
    from flywheel.training.feedback import record_feedback

    cfg = load_config(home=home, log_db=log_db)
    site = open_site(cfg)
    store = site.open_log()
    labels = site.labels(store) if site.fleet else None

    def write(decision_id: str, label: str | None, who: str | None = author) -> None:
        record_feedback(cfg, decision_id, label_name(label), author=who, store=store, labels=labels)

    return cfg, store, write, site.fleet


def _export_label_studio(path: Path, items: Sequence[ReviewItem], cfg: Any) -> None:
    import json

    from flywheel.training.feedback import known_labels
    from flywheel.training.label_studio import export_tasks, labeling_config

    path.write_text(json.dumps(export_tasks(items), ensure_ascii=False, indent=1), encoding="utf-8")
    config = path.with_suffix(".xml")
    config.write_text(labeling_config(known_labels(cfg) or ()), encoding="utf-8")
    typer.echo(f"wrote {len(items)} Label Studio task(s) to {path} and the labeling config to {config}")


def _import_label_studio(path: Path, cfg: Any, write: Callable[..., None], author: str | None,
                         known: Callable[[str], bool] | None) -> None:
    import json

    from flywheel.training.feedback import known_labels
    from flywheel.training.label_studio import LabelStudioError, read_annotations

    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LabelStudioError(f"{path}: cannot read a Label Studio export: {exc}") from None
    rows, skipped = read_annotations(doc, known_labels(cfg))
    missing = [did for did, _, _ in rows if known is not None and not known(did)]
    if missing:
        raise LabelStudioError(f"{path}: {len(missing)} task(s) name decisions not in the log (first: "
                               f"{missing[0]}); nothing was recorded")
    for did, label, who in rows:
        write(did, label, author or who)
    typer.echo(f"recorded {len(rows)} human label(s) from {path}"
               + (f"; {skipped} task(s) without a finished annotation skipped" if skipped else ""))


def walk(reviewer: Reviewer, getchar: Callable[[], str] = typer.getchar) -> None:
    """Show each item and apply keys until the queue is done, ``q`` or end of input."""
    total = len(reviewer.items)
    if not total:
        typer.echo("the review queue is empty")
        return
    typer.echo(f"{total} decisions to review ({KEYS_HELP})")
    try:
        while True:
            item = reviewer.current
            typer.echo(show(item, reviewer.position, total) if item is not None
                       else "the queue is done: u undoes the last label, q quits")
            try:
                key = getchar()
            except EOFError:
                break
            if not key or key in ("q", "\x04", "\x03"):
                break
            typer.echo("  " + reviewer.press(key.lower()))
    finally:
        reviewer.close()
    typer.echo(f"labelled {reviewer.labelled}, skipped {reviewer.skipped}, {total - reviewer.position} left")


def ui_command(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (loopback unless told otherwise)."),
    port: int = typer.Option(8765, "--port", min=0, max=65535, help="Port (0: a free one)."),
    admin_token: Optional[str] = typer.Option(None, "--admin-token", envvar="FLYWHEEL_ADMIN_TOKEN",
                                              help="The token label writes need (none: read-only)."),
    log_db: Optional[str] = typer.Option(None, "--log-db", help="Traffic log DuckDB file."),
    home: Optional[Path] = typer.Option(None, "--home", help=HOME_HELP),
) -> None:
    """Serve the review queue as a page and a JSON API (training.ui) until interrupted."""
    from flywheel.training.feedback import known_labels
    from flywheel.training.ui import ReviewApp, make_server

    cfg, store, write, _ = _open_review(home, log_db, None)
    app = ReviewApp(store, write, labels=known_labels(cfg), admin_token=admin_token, models_home=cfg.models_dir)
    server = make_server(app, host, port)
    where = f"http://{host}:{server.server_address[1]}/"
    typer.echo(f"flywheel ui: serving the review queue at {where}"
               + ("" if admin_token else " (read-only: no --admin-token)"), err=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
