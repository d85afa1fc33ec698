"""Labelled query files for training and evaluation: CLINC150 JSON, CSV and JSON Lines.

:func:`load_labelled` reads one file into :class:`LabelledData` (texts and labels,
``None`` for out of scope); :func:`intent_set_from_data` turns labelled data into an
:class:`~classifier.settings.intents.IntentSet` that :func:`classifier.layer2.fitter.fit_model` can fit.

Formats
-------
``clinc150``
    One JSON object of splits, each a list of ``[text, label]`` pairs (CLINC150's
    ``data_full.json``). ``split="train"`` reads ``train`` + ``oos_train``,
    ``split="test"`` reads ``test`` + ``oos_test`` (and ``"val"``: ``val`` + ``oos_val``).
``csv``
    A header row naming at least ``text_column`` and ``label_column``; an optional
    ``lang_column`` (default ``lang``) gives each row's language. Fields are separated by
    commas, semicolons (German Excel's default) or tabs, as the header shows
    (:func:`csv_delimiter`).
``jsonl``
    One JSON object per line with ``text_column`` and ``label_column`` keys; blank
    lines are skipped. A JSON ``null`` label means out of scope. An optional
    ``lang_column`` key (default ``lang``) gives the row's language (``null``: none).

A language is any non-empty string (``"en"``, ``"es"``, ...); CLINC150 has none.

In every format a label is read by :func:`classifier.settings.label_names.parse_label`: ``OUT_OF_SCOPE``,
``OOS`` and ``NONE`` (any case) mean out of scope, and so does ``oos_label`` (default
``"oos"``, any case). :func:`drop_unknown_labels` sets aside the rows whose label a model
does not know (``flywheel eval`` scores without them, or refuses them with ``--strict``).
A bad file raises :class:`DatasetError` naming the file, the line or row, and the problem.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from flywheel.classifier.errors import FlywheelError
from flywheel.classifier.settings.intents import Intent, IntentSet, ThresholdSettings
from flywheel.classifier.settings.label_names import parse_label

__all__ = ["CSV_DELIMITERS", "DatasetError", "LabelledData", "FORMATS", "SPLITS", "csv_delimiter", "infer_format",
           "load_labelled",
           "load_unlabelled", "drop_unknown_labels", "intent_set_from_data"]

FORMATS = ("clinc150", "csv", "jsonl")
# split name -> the CLINC150 lists it reads (in-scope first, then out of scope)
SPLITS = {"train": ("train", "oos_train"), "val": ("val", "oos_val"), "test": ("test", "oos_test")}
_EXTENSIONS = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "clinc150"}
# the field delimiters a CSV file may use (read from its header: csv_delimiter), with their names
CSV_DELIMITERS = {",": "comma", ";": "semicolon", "\t": "tab"}


class DatasetError(FlywheelError):
    """A labelled data file is missing, unreadable or malformed.

    The message names the file, the line or row (when there is one) and the problem.
    """

    exit_code = 2

    def __init__(self, path: str | Path, problem: str, where: str | None = None) -> None:
        self.path = str(path)
        self.where = where
        self.problem = problem
        prefix = self.path if where is None else f"{self.path}: {where}"
        super().__init__(f"{prefix}: {problem}")


@dataclass(frozen=True)
class LabelledData:
    """Texts with their labels (``None`` = out of scope), in file order.

    ``langs`` holds each text's language (``None`` where a row gives none), or is
    ``None`` when no row gives one.
    """

    texts: list[str]
    labels: list[str | None]
    source: str = field(default="<memory>", compare=False)
    langs: list[str | None] | None = None

    def __post_init__(self) -> None:
        if len(self.texts) != len(self.labels):
            raise ValueError(f"{len(self.texts)} texts but {len(self.labels)} labels")
        if self.langs is not None and len(self.langs) != len(self.texts):
            raise ValueError(f"{len(self.texts)} texts but {len(self.langs)} languages")

    def __len__(self) -> int:
        return len(self.texts)

    @property
    def intent_labels(self) -> list[str]:
        """The distinct in-scope labels, in order of first appearance."""
        return list(dict.fromkeys(v for v in self.labels if v is not None))

    @property
    def n_out_of_scope(self) -> int:
        return sum(1 for v in self.labels if v is None)

    def counts(self) -> dict[str | None, int]:
        """Examples per label (``None``: out of scope)."""
        out: dict[str | None, int] = {}
        for v in self.labels:
            out[v] = out.get(v, 0) + 1
        return out


def infer_format(path: str | Path) -> str:
    """The format implied by a file name's extension (``.csv``, ``.jsonl``/``.ndjson``, ``.json``)."""
    suffix = Path(path).suffix.lower()
    fmt = _EXTENSIONS.get(suffix)
    if fmt is None:
        raise DatasetError(path, f"cannot tell the format from the extension {suffix or '(none)'!r}; "
                                 f"give one of: {', '.join(FORMATS)} (.csv, .jsonl/.ndjson, .json = clinc150)")
    return fmt


def load_labelled(path: str | Path, *, fmt: str | None = None, split: str = "train",
                  text_column: str = "text", label_column: str = "label",
                  oos_label: str | None = "oos", lang_column: str | None = "lang") -> LabelledData:
    """Read a labelled data file.

    Parameters
    ----------
    path : str or Path
        The file.
    fmt : {"clinc150", "csv", "jsonl"}, optional
        Default: inferred from the extension (``.json`` is read as CLINC150).
    split : {"train", "test", "val"}
        CLINC150 only: which lists to read (``train`` + ``oos_train``, ...).
    text_column, label_column : str
        CSV columns / JSONL keys holding the text and the label.
    oos_label : str or None
        A label that also means out of scope (compared in any case), besides
        ``OUT_OF_SCOPE``, ``OOS`` and ``NONE`` (:func:`classifier.settings.label_names.parse_label`).
    lang_column : str or None
        CSV column / JSONL key holding the row's language, when present (``None``:
        ignore languages). Languages end up in :attr:`LabelledData.langs`.

    Raises
    ------
    DatasetError
        Missing or unreadable file, unknown format or split, invalid JSON (with the
        line number), a missing column or key, an empty text or label, a language
        that is not a non-empty string, or no examples.
    """
    p = Path(path)
    if fmt is None:
        fmt = infer_format(p)
    fmt = str(fmt).strip().lower()
    if fmt == "json":
        fmt = "clinc150"
    if fmt not in FORMATS:
        raise DatasetError(p, f"unknown format {fmt!r} (known: {', '.join(FORMATS)})")
    if fmt == "clinc150" and split not in SPLITS:
        raise DatasetError(p, f"unknown split {split!r} (known: {', '.join(SPLITS)})")
    oos_key = None if oos_label is None else oos_label.strip().upper()
    raw = _read_text(p)
    readers: dict[str, Callable[..., Row]] = {"clinc150": _read_clinc150, "csv": _read_csv, "jsonl": _read_jsonl}
    reader = readers[fmt]
    texts: list[str] = []
    labels: list[str | None] = []
    langs: list[str | None] = []
    rows = reader(p, raw, split=split, text_column=text_column, label_column=label_column, lang_column=lang_column)
    for where, text, label, lang in rows:
        t = _check_text(p, where, text)
        langs.append(None if lang is None else _check_lang(p, where, lang))
        if label is None:
            labels.append(None)
        else:
            lab = _check_label(p, where, label)
            labels.append(None if lab.upper() == oos_key else parse_label(lab, None))
        texts.append(t)
    if not texts:
        what = f"split {split!r} of " if fmt == "clinc150" else ""
        raise DatasetError(p, f"{what}the file contains no examples")
    has_langs = any(v is not None for v in langs)
    return LabelledData(texts, labels, source=str(p), langs=langs if has_langs else None)


# --------------------------------------------------------------------------- readers
def load_unlabelled(path: str | Path, *, text_column: str = "text") -> list[str]:
    """The texts of an unlabelled file (``flywheel eval --unlabelled``): ``.txt`` one text a
    line (blank lines skipped), ``.jsonl`` one JSON string or object with ``text_column``
    a line, ``.json`` a list of strings. Labels, if any, are ignored.

    Raises
    ------
    DatasetError
        A missing or unreadable file, another extension, a line or item that is not a text,
        or no text at all.
    """
    p = Path(path)
    raw = _read_text(p)
    ext = p.suffix.lower()
    out: list[str] = []
    if ext == ".txt":
        out = [line.strip() for line in raw.splitlines() if line.strip()]
    elif ext in (".jsonl", ".ndjson"):
        for n, line in enumerate(raw.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(p, f"not valid JSON ({exc.msg})", f"line {n}") from None
            text = item.get(text_column) if isinstance(item, dict) else item
            out.append(_check_text(p, f"line {n}", text))
    elif ext == ".json":
        try:
            items = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise DatasetError(p, f"not valid JSON ({exc.msg} at line {exc.lineno})") from None
        if not isinstance(items, list):
            raise DatasetError(p, f"an unlabelled .json file is a list of strings, got {_describe(items)}")
        out = [_check_text(p, f"item {n}", t) for n, t in enumerate(items, start=1)]
    else:
        raise DatasetError(p, f"unlabelled texts are read from .txt (one a line), .jsonl or .json (a list of "
                              f"strings), not {ext or 'a file without an extension'!r}")
    if not out:
        raise DatasetError(p, "no texts in the file")
    return out


def _read_text(p: Path) -> str:
    try:
        return p.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise DatasetError(p, "file not found") from None
    except IsADirectoryError:
        raise DatasetError(p, "is a directory, not a file") from None
    except UnicodeDecodeError as exc:
        raise DatasetError(p, f"not valid UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise DatasetError(p, f"cannot read file: {exc.strerror or exc}") from None


def _check_text(p: Path, where: str, text: Any, what: str = "text") -> str:
    if not isinstance(text, str):
        raise DatasetError(p, f"{what} must be a string, got {_describe(text)}", where)
    t = text.strip()
    if not t:
        raise DatasetError(p, f"empty {what}", where)
    return t


def _check_label(p: Path, where: str, label: Any) -> str:
    if isinstance(label, bool) or not isinstance(label, (str, int)):
        raise DatasetError(p, f"label must be a string, got {_describe(label)}", where)
    lab = str(label).strip()
    if not lab:
        raise DatasetError(p, "empty label", where)
    return lab


def _check_lang(p: Path, where: str, lang: Any) -> str:
    return _check_text(p, where, lang, "lang")


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


Row = Iterator[tuple[str, Any, Any, Any]]  # where, text, label, language (None: not given)


def _read_clinc150(p: Path, raw: str, *, split: str, **_: Any) -> Row:
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise DatasetError(p, f"invalid JSON on line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    if not isinstance(doc, dict):
        raise DatasetError(p, f"a CLINC150 file must be a JSON object of splits, got {type(doc).__name__}"
                              + (" (JSON Lines? pass fmt='jsonl')" if isinstance(doc, list) else ""))
    in_key, oos_key = SPLITS[split]
    if in_key not in doc and oos_key not in doc:
        raise DatasetError(p, f"no {in_key!r} or {oos_key!r} list (keys: {', '.join(map(str, doc)) or 'none'})")
    for key in (in_key, oos_key):
        items = doc.get(key, [])
        if not isinstance(items, list):
            raise DatasetError(p, f"{key!r} must be a list of [text, label] pairs, got {type(items).__name__}")
        for n, item in enumerate(items):
            where = f"{key!r} item #{n + 1}"
            if not isinstance(item, list) or len(item) != 2:
                raise DatasetError(p, f"expected a [text, label] pair, got {_describe(item)}", where)
            if item[1] is None:  # CLINC150 names out of scope "oos"; null is a mistake here
                raise DatasetError(p, "label is null", where)
            yield where, item[0], item[1], None


def csv_delimiter(raw: str, columns: Sequence[str] = ()) -> str:
    """The field delimiter of CSV text ``raw``, one of :data:`CSV_DELIMITERS`, read from its
    header: the first whose header names every one of ``columns``, else the one that splits
    the header into the most columns (a comma on a tie). So a comma-separated file is always
    read as one, and a semicolon-separated one (German Excel's default) or a tab-separated
    one is read as such without an option: only the header decides, never the rows' text."""
    best, most = ",", 0
    for delimiter in CSV_DELIMITERS:
        try:
            header = next(csv.reader(io.StringIO(raw, newline=""), delimiter=delimiter), None) or []
        except csv.Error:
            continue
        names = [h.strip() for h in header]
        if columns and all(c in names for c in columns):
            return delimiter
        if len(names) > most:
            best, most = delimiter, len(names)
    return best


def _read_csv(p: Path, raw: str, *, text_column: str, label_column: str, lang_column: str | None = None,
              **_: Any) -> Row:
    delimiter = csv_delimiter(raw, (text_column, label_column))
    reader = csv.reader(io.StringIO(raw, newline=""), delimiter=delimiter)
    try:
        header = next(reader, None)
    except csv.Error as exc:
        raise DatasetError(p, f"malformed CSV header: {exc}", "line 1") from None
    if header is None or not any(h.strip() for h in header):
        raise DatasetError(p, "empty file: expected a header row naming the columns")
    names = [h.strip() for h in header]
    missing = [c for c in (text_column, label_column) if c not in names]
    if missing:
        read_as = "" if delimiter == "," else f"; read as {CSV_DELIMITERS[delimiter]}-separated"
        raise DatasetError(p, f"missing column {missing[0]!r} (columns: {', '.join(repr(n) for n in names)}"
                              f"{read_as})", "header (line 1)")
    ti, li = names.index(text_column), names.index(label_column)
    gi = names.index(lang_column) if lang_column is not None and lang_column in names else None
    last = max(ti, li) if gi is None else max(ti, li, gi)
    row_no = 0
    while True:
        start = reader.line_num + 1
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise DatasetError(p, f"malformed CSV: {exc}", f"line {start}") from None
        if not row or all(not c.strip() for c in row):
            continue  # blank line
        row_no += 1
        where = f"line {start} (row {row_no})" if reader.line_num == start else \
            f"lines {start}-{reader.line_num} (row {row_no})"
        if len(row) <= last:
            raise DatasetError(p, f"has {len(row)} field(s), expected {len(names)}", where)
        yield where, row[ti], row[li], None if gi is None else row[gi]


def _read_jsonl(p: Path, raw: str, *, text_column: str, label_column: str, lang_column: str | None = None,
                **_: Any) -> Row:
    # split on "\n" only: JSON strings may hold U+2028 and other characters splitlines() breaks on
    for n, line in enumerate(raw.split("\n"), start=1):
        line = line.rstrip("\r")
        if not line.strip():
            continue
        where = f"line {n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(p, f"invalid JSON on line {n}: {exc.msg} (column {exc.colno})") from None
        if not isinstance(obj, dict):
            raise DatasetError(p, f"expected a JSON object, got {type(obj).__name__}", where)
        for key in (text_column, label_column):
            if key not in obj:
                raise DatasetError(p, f"missing key {key!r} (keys: {', '.join(map(repr, obj)) or 'none'})", where)
        yield where, obj[text_column], obj[label_column], None if lang_column is None else obj.get(lang_column)


def drop_unknown_labels(data: LabelledData, known: Sequence[str]) -> tuple[LabelledData, dict[str, int]]:
    """``data`` without the rows whose label is not in ``known`` (out of scope always is),
    and how many rows each such label had (most first, then by name; empty when none)."""
    names = set(known)
    keep = [i for i, v in enumerate(data.labels) if v is None or v in names]
    counts: dict[str, int] = {}
    for v in data.labels:
        if v is not None and v not in names:
            counts[v] = counts.get(v, 0) + 1
    if not counts:
        return data, {}
    skipped = dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    langs = None if data.langs is None else [data.langs[i] for i in keep]
    kept = LabelledData([data.texts[i] for i in keep], [data.labels[i] for i in keep], source=data.source,
                        langs=langs if langs and any(v is not None for v in langs) else None)
    return kept, skipped


# ----------------------------------------------------------------- intent sets
def intent_set_from_data(data: LabelledData, *, name: str, base: IntentSet | None = None) -> IntentSet:
    """An intent set with one intent per label of ``data``.

    Each intent's examples are its texts and its description is the label name; the
    out-of-scope examples are the texts labelled ``None``. Embedder, teacher and
    threshold settings come from ``base`` when given (per-intent thresholds and rules
    only for intents that exist in ``data``), else the defaults.

    Raises
    ------
    DatasetError
        ``data`` has no in-scope examples.
    """
    by_label: dict[str, list[str]] = {}
    oos: list[str] = []
    for text, label in zip(data.texts, data.labels):
        if label is None:
            oos.append(text)
        else:
            by_label.setdefault(label, []).append(text)
    if not by_label:
        raise DatasetError(data.source, "no in-scope examples: every text is labelled out of scope")
    intents = tuple(Intent(name=label, description=label, examples=tuple(texts))
                    for label, texts in by_label.items())
    if base is None:
        return IntentSet(name=name, intents=intents, oos_examples=tuple(oos), source=data.source)
    known = set(by_label)
    base_conf = {i.name: i.confident for i in base.intents if i.confident is not None}
    intents = tuple(replace(i, confident=base_conf[i.name]) if i.name in base_conf else i for i in intents)
    th = base.thresholds
    thresholds = ThresholdSettings(confident=th.confident, ambiguous_ratio=th.ambiguous_ratio, oos=th.oos,
                                   target_precision=th.target_precision, target=th.target,
                                   per_intent={k: v for k, v in th.per_intent.items() if k in known})
    rules = tuple(r for r in base.rules if r.intent in known)
    return IntentSet(name=name, intents=intents, rules=rules, oos_examples=tuple(oos), embedder=base.embedder,
                     languages=base.languages, synthetic_negatives=base.synthetic_negatives, teacher=base.teacher,
                     thresholds=thresholds, source=data.source)
