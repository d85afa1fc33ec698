"""``flywheel review`` and ``flywheel ui``: walk the review queue (:mod:`training.review.queue`) in the terminal, one
keystroke per label, or print it as JSON.

Keys: ``1``-``9`` pick the numbered intent (the likely ones first, then the rest of the
served set), ``/`` finds any intent of the served set (type part of its name, Enter picks
the first match, Esc cancels), ``o`` out of scope, ``s`` skip, ``u`` undo the last label or
skip, ``f`` show the whole text (a long one is clipped), ``q`` quit. A label is a human label
(``flywheel feedback``'s, so it wins at the next retrain), written for every decision with
the same text; it is written when the next key is read, so that ``u`` can take it back
without a second label in the log, and on quit or end of input.

The walk reads keys from the terminal (stdin, else ``/dev/tty``); without one (a pipe with
no terminal, cron, ``docker exec`` without ``-t``) it stops with one line that names
``--json`` and ``flywheel ui`` (:class:`NoTerminalError`, exit code 2).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, List, Optional

import typer

from flywheel.classifier.errors import InvalidInputError
from flywheel.classifier.settings.config import load_config
from flywheel.classifier.settings.label_names import OUT_OF_SCOPE, label_name
from flywheel.classifier.settings.listen import check_listen
from flywheel.classifier.settings.output import echo_json
from flywheel.training.cli._options import HOME_OPTION, LOG_DB_OPTION
from flywheel.training.review.queue import REASONS, ReviewFilters, ReviewItem, all_choices

if TYPE_CHECKING:
    from flywheel.fleet.human_labels import HumanLabels
    from flywheel.fleet.site import Site
    from flywheel.logstore import LogStore
    from flywheel.training.review.app import ReviewApp

__all__ = ["NoTerminalError", "Reviewer", "review_command", "ui_app", "ui_command"]

KEY_HINTS = ("1-9 pick", "/ find any intent", "o out of scope", "s skip", "u undo", "f full text", "q quit")
KEYS_HELP = ", ".join(KEY_HINTS)
CLIP = 300          # characters of a text shown before ``f``
ENTER, ESCAPE, BACKSPACE = ("\r", "\n"), "\x1b", ("\x7f", "\x08")


class NoTerminalError(InvalidInputError):
    """``flywheel review`` cannot read keys: no terminal (exit code 2)."""


def _words(name: str) -> str:
    return re.sub(r"[\s_-]+", " ", name.lower()).strip()


def find(query: str, names: Sequence[str]) -> list[str]:
    """``names`` that contain ``query`` (case, blanks, ``_`` and ``-`` aside): the exact one
    first, then those it starts, then the rest, each in ``names``' order."""
    q = _words(query)
    hits = [n for n in names if q in _words(n)]
    return sorted(hits, key=lambda n: (_words(n) != q, not _words(n).startswith(q)))


@dataclass
class Reviewer:
    """The review walk as a state machine over ``items``: :meth:`press` takes one key and
    returns what to tell the person. ``write(decision_id, label)`` stores a human label
    (``None`` = out of scope), once for each of an item's ``decision_ids``. ``labels``: the
    served set, every intent of which may be given (``None``: only the items' choices).
    The last label is held back until the next key (``u`` drops it and goes back to its
    item) and written by :meth:`close`; ``u`` after a skip goes back to the skipped item."""

    items: Sequence[ReviewItem]
    write: Callable[[str, str | None], object]
    labels: Sequence[str] | None = None
    position: int = 0
    labelled: int = 0
    skipped: int = 0
    answered: int = 0       # decisions the labels answer (an item may stand for several)
    _held: tuple[int, str | None] | None = field(default=None, repr=False)
    _skipped_at: int | None = field(default=None, repr=False)
    _query: str | None = field(default=None, repr=False)   # the find query while finding

    @property
    def done(self) -> bool:
        return self.position >= len(self.items)

    @property
    def current(self) -> ReviewItem | None:
        return None if self.done else self.items[self.position]

    @property
    def finding(self) -> bool:
        """Whether keys are typed into the find query (``q`` is a letter then)."""
        return self._query is not None

    def numbered(self, item: ReviewItem) -> tuple[str, ...]:
        """The intents ``1``-``9`` pick for ``item``: its likely ones, then the rest of the served set."""
        return all_choices(item, self.labels)[:9]

    def press(self, key: str) -> str:
        """Apply one key; returns what to tell the person (one line, or the text for ``f``)."""
        if self._query is not None and not self.done:
            return self._find_key(key)
        if key == "u":
            return self._undo()
        if self.done:
            return "the queue is done"
        item = self.items[self.position]
        if key == "s":
            self._flush()
            self._skipped_at = self.position
            self.skipped += 1
            self.position += 1
            return "skipped"
        if key == "o":
            return self._label(None)
        if key == "f":
            return repr(item.text)
        if key == "/":
            self._query = ""
            return self._find_line()
        choices = self.numbered(item)
        if key.isdigit() and 1 <= int(key) <= len(choices):
            return self._label(choices[int(key) - 1])
        return f"unknown key {key!r} ({KEYS_HELP})"

    def _undo(self) -> str:
        if self._held is not None:
            self.position, _ = self._held
            self._held = None
            self.labelled -= 1
            self.answered -= self.items[self.position].count
            return "undone"
        if self._skipped_at is not None:
            self.position, self._skipped_at = self._skipped_at, None
            self.skipped -= 1
            return "undone: back to the skipped item"
        return "nothing to undo"

    def _names(self) -> list[str]:
        item = self.items[self.position]
        return [*all_choices(item, self.labels), OUT_OF_SCOPE]

    def _find_line(self) -> str:
        hits = find(self._query or "", self._names())
        if not hits:
            return f"find {self._query!r}: no intent matches (Backspace edits, Esc cancels)"
        shown = ", ".join(hits[:9]) + (f" (+{len(hits) - 9} more)" if len(hits) > 9 else "")
        return f"find {self._query!r}: {shown}; Enter picks {hits[0]}, Esc cancels"

    def _find_key(self, key: str) -> str:
        query = self._query or ""
        if key in ENTER:
            hits = find(query, self._names())
            if not hits:
                return self._find_line()
            self._query = None
            return self._label(None if hits[0] == OUT_OF_SCOPE else hits[0])
        if key == ESCAPE:
            self._query = None
            return "find cancelled"
        if key in BACKSPACE:
            self._query = query[:-1]
        elif key.isprintable() and not key.startswith(ESCAPE):
            self._query = query + key
        else:
            return f"find {query!r}: type part of an intent's name, Enter picks, Esc cancels"
        return self._find_line()

    def _label(self, label: str | None) -> str:
        self._flush()
        self._skipped_at = None
        self._held = (self.position, label)
        self.labelled += 1
        n = self.items[self.position].count
        self.answered += n
        self.position += 1
        return f"labelled {label_name(label)}" + (f" ({n} decisions with this text)" if n > 1 else "")

    def _flush(self) -> None:
        if self._held is not None:
            index, label = self._held
            self._held = None
            for decision_id in self.items[index].decision_ids:
                self.write(decision_id, label)

    def close(self) -> None:
        """Write the label still held back."""
        self._flush()


def columns() -> int:
    """The terminal's width in columns (``COLUMNS``, else the terminal's, else 80; at least 40)."""
    return max(40, shutil.get_terminal_size((80, 24)).columns)


def flow(parts: Sequence[str], width: int, *, first: str = "  ", indent: str = "    ", sep: str = "  ") -> str:
    """``parts`` laid out on lines of at most ``width`` columns, ``sep`` between them, each
    part whole (an intent name, a key hint: a part wider than a line has a line to itself);
    the first line starts with ``first``, the others with ``indent``."""
    lines: list[str] = []
    line = first
    for part in parts:
        if line.strip() and len(line) + len(sep) + len(part) > width:
            lines.append(line.rstrip())
            line = indent
        line += (sep if line.strip() else "") + part
    lines.append(line.rstrip())
    return "\n".join(lines)


def fit(line: str, width: int, *, indent: str = "    ") -> str:
    """``line`` wrapped on blanks to ``width`` columns (later lines start with ``indent``),
    never inside a word (an intent name, a reason) nor inside one of :data:`KEY_HINTS`."""
    nbsp = "\xa0"      # textwrap breaks on ASCII blanks only: a hint's own blanks hold it together
    for hint in KEY_HINTS:
        line = line.replace(hint, hint.replace(" ", nbsp))
    lines = textwrap.wrap(line, width, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False,
                          drop_whitespace=True) or [""]
    return "\n".join(x.replace(nbsp, " ") for x in lines)


def _clipped(text: str) -> str:
    if len(text) <= CLIP:
        return repr(text)
    return f"{text[:CLIP]!r}... (+{len(text) - CLIP:,} characters: f shows all)"


def show(item: ReviewItem, index: int, total: int, labels: Sequence[str] | None = None,
         width: int | None = None) -> str:
    """The lines a person reads for one item (plain text: a terminal shows no markup); a long
    text is clipped to :data:`CLIP` characters. flywheel's own lines fit ``width`` columns
    (``None``: the terminal's), broken between words and between choices, never inside an
    intent name or a key hint; the text itself is shown as it is (the terminal wraps it)."""
    width = columns() if width is None else width
    conf = "" if item.confidence is None else f" ({item.confidence:.2f})"
    lines = [f"[{index + 1}/{total}] {_clipped(item.text)}"]
    if item.count > 1:
        lines.append(f"  {item.count} decisions with this text: one label answers them all")
    lines.append(fit(f"  served {label_name(item.label)}{conf} by {item.layer}; why: {', '.join(item.reasons)}",
                     width))
    if item.l2_answered and item.l2_label != item.label:   # what teacher_vs_l2 compares, as the page shows it
        l2_conf = "" if item.l2_confidence is None else f" ({item.l2_confidence:.2f})"
        lines.append(fit(f"  layer 2: {label_name(item.l2_label)}{l2_conf}", width))
    if item.teacher_answered or item.candidates:
        said = ", ".join(label_name(c) for c in item.candidates) if item.candidates \
            else label_name(item.teacher_label)
        lines.append(fit(f"  teacher: {said}", width))
    if item.shadow_label is not None:
        lines.append(fit(f"  shadow: {label_name(item.shadow_label)}", width))
    every = all_choices(item, labels)
    picks = [f"{i}) {c}" for i, c in enumerate(every[:9], 1)]
    likely = sum(1 for c in every[:9] if c in item.choices)
    if 0 < likely < len(picks):        # the likely ones, then the rest of the served set
        picks.insert(likely, "|")
    rest = len(every) - min(len(every), 9)
    lines.append(flow([*picks, f"o) {OUT_OF_SCOPE}", "/) find any intent" + (f" ({rest} more)" if rest else "")],
                      width))
    return "\n".join(lines)


def review_command(
    as_json: bool = typer.Option(False, "--json", help="Print the queue as JSON and label nothing."),
    limit: int = typer.Option(50, "--limit", min=1, help="Items in the queue."),
    intent: Optional[str] = typer.Option(None, "--intent", help="Only decisions about this intent."),
    tier: Optional[str] = typer.Option(None, "--tier", help="Only this served tier."),
    layer: Optional[str] = typer.Option(None, "--layer", help="Only this layer (rules, embedding, llm)."),
    language: Optional[str] = typer.Option(None, "--language",
                                           help="Only queries in this logged language (en, es, unknown)."),
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
    log_db: Optional[str] = LOG_DB_OPTION,
    home: Optional[Path] = HOME_OPTION,
) -> None:
    """Review the decisions most worth a label: one keystroke each; the labels win at the next retrain."""
    import time

    from flywheel.training.review.queue import review_queue

    _, store, writer = _open_review(home, log_db)
    if import_ls is not None:
        # locally every decision must be in the log before anything is written; a fleet's labels
        # may name a decision another replica has not shipped yet (checked at retrain)
        _import_label_studio(import_ls, writer, author, None if writer.fleet else store.has_decision)
        return
    filters = ReviewFilters(intent=intent, tier=tier, layer=layer, reasons=tuple(reason or ()),
                            min_confidence=min_confidence, max_confidence=max_confidence,
                            since=None if days is None else time.time() - days * 86_400, language=language)
    served = writer.labels     # the served model's, read once
    items = review_queue(store, filters, limit=limit, labels=served)
    if export_ls is not None:
        _export_label_studio(export_ls, items, served)
        return
    if as_json:
        echo_json({"items": [it.to_dict() for it in items], "n": len(items), "intents": intents(items, served)})
        return
    check_terminal()
    walk(Reviewer(items, lambda did, label: writer.record(did, label, author=author), served))


def intents(items: Sequence[ReviewItem], labels: Sequence[str] | None) -> list[str]:
    """Every label a reviewer may give, once for the whole queue (``--json``'s ``intents``): the
    served set in its order (``None``, unknown: every item's choices), then ``OUT_OF_SCOPE``."""
    names = list(labels) if labels is not None else [c for it in items for c in all_choices(it, None)]
    return [n for n in dict.fromkeys(names) if n != OUT_OF_SCOPE] + [OUT_OF_SCOPE]


def check_terminal() -> None:
    """Raise :class:`NoTerminalError` when the walk cannot read keys the way click's
    ``getchar`` does: stdin is not a terminal and ``/dev/tty`` cannot be opened. A stdin
    without a file descriptor is an in-process input (click's test runner), which ``getchar``
    reads as it is."""
    if os.name == "nt":
        return
    try:
        fd = sys.stdin.fileno() if sys.stdin is not None else -1
    except (OSError, ValueError):
        return
    if fd >= 0 and os.isatty(fd):
        return
    try:
        with open("/dev/tty", "rb"):
            return
    except OSError:
        raise NoTerminalError("flywheel review reads keys from a terminal and there is none (stdin is not one "
                              "and /dev/tty cannot be opened); print the queue with flywheel review --json, "
                              "or label it in a browser with flywheel ui") from None


def _open_review(home: Optional[Path], log_db: Optional[str]) -> tuple[Site, LogStore, HumanLabels]:
    """``(site, log, writer)`` for the review commands: the log (mirrored in fleet mode) and the
    site's one writer of human labels (:class:`fleet.human_labels.HumanLabels`: the served
    model's labels, through the fleet's labels in fleet mode, so they ship), as
    ``flywheel feedback`` records them."""
    from flywheel.fleet.site import open_site

    site = open_site(load_config(home=home, log_db=log_db))
    store = site.open_log()
    return site, store, site.human_labels(store)


def _export_label_studio(path: Path, items: Sequence[ReviewItem], labels: Sequence[str] | None) -> None:
    import json

    from flywheel.training.review.label_studio import export_tasks, labeling_config

    path.write_text(json.dumps(export_tasks(items), ensure_ascii=False, indent=1), encoding="utf-8")
    config = path.with_suffix(".xml")
    config.write_text(labeling_config(labels or ()), encoding="utf-8")
    typer.echo(f"wrote {len(items)} Label Studio task(s) to {path} and the labeling config to {config}")


def _import_label_studio(path: Path, writer: HumanLabels, author: str | None,
                         known: Callable[[str], bool] | None) -> None:
    import json

    from flywheel.training.review.label_studio import LabelStudioError, import_annotations, read_annotations

    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LabelStudioError(f"{path}: cannot read a Label Studio export: {exc}") from None
    rows, skipped = read_annotations(doc, writer.labels)
    merged = _merged_ids(path, doc)
    rows = [a._replace(decision_id=one) for a in rows for one in merged.get(a.decision_id, (a.decision_id,))]
    # each label once: the same export imported again records nothing and says so
    report = import_annotations(rows, skipped, writer, author=author, known=known, where=path)
    typer.echo(report.summary(path))


def _merged_ids(path: Path, doc: Any) -> dict[str, tuple[str, ...]]:
    """``{decision_id: decision_ids}`` of the tasks that stand for several decisions with the
    same text (``data.decision_ids``, written by :func:`training.review.label_studio.export_tasks`)."""
    from flywheel.training.review.label_studio import LabelStudioError

    out: dict[str, tuple[str, ...]] = {}
    for i, task in enumerate(doc):
        ids, did = task["data"].get("decision_ids"), task["data"].get("decision_id")
        if ids is None:
            continue
        if not isinstance(ids, list) or not ids or not all(isinstance(x, str) and x.strip() for x in ids) \
                or ids[0].strip() != str(did).strip():
            raise LabelStudioError(f"{path}: task {i}: data.decision_ids must be a list of decision ids that "
                                   f"starts with data.decision_id; nothing was recorded")
        out[str(did).strip()] = tuple(x.strip() for x in ids)
    return out


def walk(reviewer: Reviewer, getchar: Callable[[], str] = typer.getchar, width: int | None = None) -> None:
    """Show each item and apply keys until the queue is done, ``q`` or end of input. An item
    is shown when the walk comes to it; any other key answers in a line of its own. Lines fit
    ``width`` columns (``None``: the terminal's; see :func:`show`)."""
    total = len(reviewer.items)
    if not total:
        typer.echo("the review queue is empty")
        return
    width = columns() if width is None else width
    typer.echo(flow([f"{total} items to review:", *(h + "," for h in KEY_HINTS[:-1]), KEY_HINTS[-1]], width,
                    first="", indent="  ", sep=" "))
    shown = -1
    try:
        while True:
            if reviewer.position != shown:
                item, shown = reviewer.current, reviewer.position
                typer.echo(show(item, reviewer.position, total, reviewer.labels, width) if item is not None
                           else fit("the queue is done: u undoes the last label, q quits", width))
            try:
                key = getchar()
            except EOFError:
                break
            if not key or key in ("\x04", "\x03") or (key == "q" and not reviewer.finding):
                break
            full = key.lower() == "f" and not reviewer.finding     # the text as it is, as the item shows it
            reply = reviewer.press(key if reviewer.finding else key.lower())
            typer.echo("  " + reply if full else fit("  " + reply, width))
    finally:
        reviewer.close()
    answered = f" ({reviewer.answered} decisions)" if reviewer.answered != reviewer.labelled else ""
    typer.echo(f"labelled {reviewer.labelled}{answered}, skipped {reviewer.skipped}, "
               f"{total - reviewer.position} left")


def ui_command(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (loopback unless told otherwise)."),
    port: int = typer.Option(8765, "--port", min=0, max=65535, help="Port (0: a free one)."),
    admin_token: Optional[str] = typer.Option(None, "--admin-token", envvar="FLYWHEEL_ADMIN_TOKEN",
                                              help="The token label writes need (none: read-only)."),
    log_db: Optional[str] = LOG_DB_OPTION,
    home: Optional[Path] = HOME_OPTION,
) -> None:
    """Serve the review queue as a page and a JSON API until interrupted."""
    from flywheel.training.review.app import make_server

    check_listen(host, port, "--host/--port")   # a taken port or a foreign host: one line, before the log opens
    server = make_server(ui_app(home, log_db, admin_token), host, port)
    where = f"http://{host}:{server.server_address[1]}/"
    typer.echo(f"flywheel ui: serving the review queue at {where}"
               + ("" if admin_token else " (read-only: no --admin-token)"), err=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def ui_app(home: Optional[Path], log_db: Optional[str], admin_token: Optional[str], *,
           clock: Callable[[], float] | None = None) -> ReviewApp:
    """The app ``flywheel ui`` serves: the review over the site's log and its one writer of
    human labels, following the served version (its labels asked of the site again once
    they are :data:`~training.review.app.LABELS_MAX_AGE_S` old by ``clock``, so a promotion
    with another intent set shows without a restart), with the retrain history of the site's
    registry's versions."""
    from flywheel.training.review.app import LABELS_MAX_AGE_S, ReviewApp
    from flywheel.training.review.dashboard import retrain_history

    site, store, writer = _open_review(home, log_db)
    return ReviewApp(store, writer.following(LABELS_MAX_AGE_S, clock=clock), admin_token=admin_token,
                     history=lambda: retrain_history(site.version_reports()))
