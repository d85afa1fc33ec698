"""Intent definition files (YAML or TOML): intents, rules, out-of-scope examples,
thresholds, embedder and teacher settings, follow-ups (classifier.settings.followups).
A bad file raises :class:`~classifier.errors.IntentFileError` naming the file, the
intent (when there is one) and the problem.
"""

from __future__ import annotations

import logging
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from flywheel.classifier.encoders.backends import (
    BACKENDS,
    EMBEDDER_RUNTIMES,
    ENGLISH_DEFAULT,
    MULTILINGUAL_DEFAULT,
    resolve_backend,
)
from flywheel.classifier.errors import IntentFileError, TuneSettingsError
from flywheel.classifier.layer2.targets import threshold_target
from flywheel.classifier.settings.followups import DEFAULT_FOLLOWUPS, parse_followups
from flywheel.classifier.settings.label_names import OUT_OF_SCOPE_NAMES, suggest_label

RULE_KINDS = ("contains", "prefix", "regex", "keywords")
#: ``embedder.backend``: the backends classifier.encoders.backends describes (and ``runtime``: its EMBEDDER_RUNTIMES)
EMBEDDER_BACKENDS = tuple(BACKENDS)
TEACHER_BACKENDS = ("ollama", "openai")
#: ``teacher.response_format`` (openai backend): ``auto`` starts with ``json_schema`` and moves
#: down the list to ``json_object`` as the server refuses each (classifier.teachers.openai)
TEACHER_RESPONSE_FORMATS = ("auto", "json_schema", "json_object_schema", "json_object", "none")
#: ``teacher.system_prompt``: ``user`` folds the instructions into the user turn, for chat
#: templates that drop the system role
SYSTEM_PROMPT_MODES = ("system", "user")
#: ``teacher.keep_alive``: a Go duration as Ollama reads it ("30m", "1h30m", "-1s" = forever)
_DURATION = re.compile(r"^-?(?:0|(?:\d+(?:\.\d+)?(?:ns|us|µs|ms|s|m|h))+)$")
#: What ``embedder.backend: auto`` (the default) becomes: MiniLM for English-only intent
#: sets (``languages: [en]``, the default), the multilingual USE encoder when the file
#: declares any other language (classifier.encoders.backends.resolve_backend). Measured in
#: BENCHMARKS.md, section 9.
ENGLISH_BACKEND = ENGLISH_DEFAULT.id
MULTILINGUAL_BACKEND = MULTILINGUAL_DEFAULT.id
_LANGUAGE = re.compile(r"^[a-z]{2,3}(?:-[A-Za-z0-9]{2,8})*$")

_TOP_KEYS = {"version", "name", "description", "languages", "embedder", "teacher", "thresholds",
             "rules", "intents", "out_of_scope", "followups"}
_INTENT_KEYS = {"name", "description", "examples", "thresholds", "metadata"}
_RULE_KEYS = {"id", "intent", "priority", "description", *RULE_KINDS}
_EMBEDDER_KEYS = {"backend", "model", "batch_size", "max_chars", "device", "use_fp16", "quantize",
                  "num_threads", "layers", "runtime", "tune"}
_TUNE_KEYS = {"objective", "budget_s", "epochs", "batch_size", "learning_rate", "max_length", "seed", "holdout",
              "calibration", "unlabelled", "unlabelled_rows"}
#: what ``embedder.tune.objective`` may be (training.tuner.finetune.EncoderTuner)
TUNE_OBJECTIVES = ("cross_entropy", "contrastive", "adapter")
# how the head of a tuned encoder learns its calibration and cutoffs (TuneSettings.calibration)
TUNE_CALIBRATIONS = ("auto", "holdout", "crossfit")
#: the backends ``flywheel retrain`` tunes when the intent file leaves ``embedder.tune`` out
#: (:func:`retrain_tuning`; their specs say so); a sentence-transformers directory is tuned when the file asks
TUNED_BY_DEFAULT = tuple(s.id for s in BACKENDS.values() if s.tuned_by_default)
_TEACHER_KEYS = {"backend", "model", "host", "timeout_s", "max_candidates",
                 "examples_per_intent", "history_size", "breaker_failures", "breaker_reset_s",
                 "confidence", "max_calls_per_minute", "daily_budget", "keep_alive", "system_prompt",
                 "response_format", "cache_size", "cache_ttl_s", "ask_twice"}
log = logging.getLogger("flywheel.intents")

_THRESHOLD_KEYS = {"confident", "ambiguous_ratio", "ambiguous_margin", "oos", "target_precision", "per_intent",
                   "coverage", "deferral", "target"}
DEFERRAL_RULES = ("tiers", "risk")
_OLD_RATIO_KEY = "ambiguous_margin"   # the old name of ambiguous_ratio, still read (with a warning)
_PER_INTENT_KEYS = {"confident"}
_OOS_KEYS = {"examples", "description", "synthetic"}


@dataclass(frozen=True)
class Rule:
    """A deterministic layer-1 rule. Exactly one of the match kinds is set."""

    id: str
    intent: str
    priority: int = 0
    kind: str = "contains"
    patterns: tuple[Any, ...] = ()
    description: str = ""


@dataclass(frozen=True)
class Intent:
    name: str
    description: str
    examples: tuple[str, ...]
    confident: float | None = None  # per-intent override of the confident cutoff
    # what the host does with this route (e.g. {"rag": "false", "model_slot": "conversational"});
    # returned with every decision for this label
    metadata: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TuneSettings:
    """``embedder.tune``: fine-tune the encoder on the retrain's labels (training.tuner.finetune).

    ``tune: true`` takes these defaults; a mapping sets any of them. The default budget
    fits a nightly job on 2 cores (BENCHMARKS.md §14)."""

    objective: str = "cross_entropy"
    budget_s: float = 900.0
    epochs: int = 4
    batch_size: int = 32
    learning_rate: float = 1e-4
    max_length: int = 64
    seed: int = 0
    # share of each intent's rows kept out of the tuning, so the head's cutoffs and
    # calibration are learned on rows the tuned encoder has not seen (BENCHMARKS.md §14.3)
    holdout: float = 0.2
    # "holdout": calibrate on the held-out rows; "crossfit": tune two more encoders on the
    # two halves of the rows and calibrate each half on the other's encoder (every row
    # calibrates, nothing is held out of the served encoder; about twice the tuning time);
    # "auto": crossfit up to training.tuner.export.CROSSFIT_MAX_ROWS rows, where a holdout
    # costs the most, holdout above (BENCHMARKS.md §14.12)
    calibration: str = "auto"
    # share of budget_s for the self-supervised stage on unlabelled texts before the tuning
    # (training.tuner.unlabelled: the logged queries in a retrain, --unlabelled FILE in eval);
    # 0: no stage. At most unlabelled_rows distinct texts, a seeded draw (issue 35)
    unlabelled: float = 0.0
    unlabelled_rows: int = 20000

    def __post_init__(self) -> None:
        """The one check of these settings, wherever they come from (the intent file,
        ``--tune-*`` flags, ``RetrainOptions``): :class:`TuneSettingsError` names the
        first field out of range; numbers are stored as floats."""
        for name, allowed in (("objective", TUNE_OBJECTIVES), ("calibration", TUNE_CALIBRATIONS)):
            value = getattr(self, name)
            if not isinstance(value, str) or value not in allowed:
                raise TuneSettingsError(name, f"must be one of {', '.join(allowed)}, got {value!r}")
        for name, lo, hi in _TUNE_BOUNDS:
            value = getattr(self, name)
            if hi is not None:
                object.__setattr__(self, name, _tune_number(name, value, lo, hi))
            elif isinstance(value, bool) or not isinstance(value, int) or value < lo:
                raise TuneSettingsError(name, f"must be an integer >= {lo}, got {value!r}")


# TuneSettings' bounds, stated once, in field order: (name, lowest, highest; None: an integer)
_TUNE_BOUNDS: tuple[tuple[str, Any, float | None], ...] = (
    ("budget_s", 0.0, 7 * 86400.0), ("epochs", 1, None), ("batch_size", 2, None), ("learning_rate", 1e-8, 1.0),
    ("max_length", 8, None), ("seed", 0, None), ("holdout", 0.0, 0.5), ("unlabelled", 0.0, 0.5),
    ("unlabelled_rows", 1, None))


def _tune_number(name: str, value: Any, lo: float, hi: float) -> float:
    """``value`` as a float within ``[lo, hi]`` (the budget: above 0), else :class:`TuneSettingsError`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TuneSettingsError(name, f"must be a number, got {value!r}")
    if name == "budget_s" and not 0.0 < float(value) <= hi:
        raise TuneSettingsError(name, f"must be a positive number of seconds up to {hi:g} (7 days), got {value!r}")
    if not lo <= float(value) <= hi:
        raise TuneSettingsError(name, f"must be between {lo} and {hi}, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class EmbedderSettings:
    backend: str = ENGLISH_BACKEND  # never "auto" here: parse_intents resolves it from the languages
    model: str | None = None
    batch_size: int = 64
    max_chars: int = 4000
    device: str | None = None
    use_fp16: bool = False
    # int8: None ("auto", the default) is int8 where it was measured to cost <= 0.3 points of
    # CLINC150 in-scope accuracy: MiniLM on ONNX Runtime (classifier.encoders.default_quantize)
    quantize: bool | None = None
    num_threads: int | None = None   # torch intra-op threads (process-wide); 1 is best for serving
    layers: tuple[int, ...] | None = None  # minilm: mean-pool and concatenate these hidden layers
    # "auto": onnx on CPU for the transformer backends, torch on a GPU device (see
    # classifier.encoders.resolve_runtime); "onnx": exported once, verified, cached, served
    # by onnxruntime; "torch": the transformers forward pass. use-multilingual is numpy: auto only.
    runtime: str = "auto"
    # ``embedder.tune`` as the file gives it (None: left out or off; see retrain_tuning for
    # what the retrain does then); train and eval tune only when it is set
    tune: TuneSettings | None = None
    # the file says ``tune: off`` (or false): the retrain never tunes by default
    tune_off: bool = False


@dataclass(frozen=True)
class TeacherSettings:
    backend: str = "ollama"
    model: str = "llama3.1:8b"
    host: str | None = None
    timeout_s: float = 5.0
    max_candidates: int = 6
    examples_per_intent: int = 3
    history_size: int = 6
    breaker_failures: int = 3
    breaker_reset_s: float = 30.0
    confidence: float = 0.9  # reported for LLM decisions: the teacher's assumed accuracy
    keep_alive: str = "30m"        # ollama: how long the model stays loaded after a call
    system_prompt: str = "system"  # "user": the instructions go in the user turn (SYSTEM_PROMPT_MODES)
    response_format: str = "auto"  # openai: how the answer is constrained (TEACHER_RESPONSE_FORMATS)
    # the call budget of this process (classifier.teachers.budget); None: unlimited
    max_calls_per_minute: int | None = None  # in any sliding 60 s window
    daily_budget: int | None = None          # per UTC day
    # the answer cache of this process (classifier.teachers.cache): answers kept at most
    # (0: no cache) and for how long, in seconds
    cache_size: int = 10_000
    cache_ttl_s: float = 86_400.0
    # layer 3 asks again, options in another order, when the teacher and layer 2 disagree;
    # two different answers make a candidate set (never a training label). Off until the
    # flywheel benchmark weighs the extra calls against the labels saved.
    ask_twice: bool = False


@dataclass(frozen=True)
class ThresholdSettings:
    """Cutoffs; ``None`` means learned from data when the model is fitted."""

    confident: float | None = None
    ambiguous_ratio: float | None = None
    oos: float | None = None
    target_precision: float = 0.95
    per_intent: dict[str, float] = field(default_factory=dict)
    # nominal coverage of the conformal prediction set (the alternatives of an unsure answer)
    coverage: float = 0.95
    # when layer 2 asks the teacher: "tiers" (the confident / ambiguous_ratio / oos_confident
    # cutoffs) or "risk" (its calibrated probability of being wrong above a cutoff)
    deferral: str = "tiers"
    # the operating point: one of oos_recall, llm_share, precision (classifier.layer2.operating_point)
    target: dict[str, float] | None = None


@dataclass(frozen=True)
class IntentSet:
    name: str
    intents: tuple[Intent, ...]
    rules: tuple[Rule, ...] = ()
    languages: tuple[str, ...] = ("en",)
    # generated nonsense texts that train the out-of-scope class (classifier.layer2.negatives); 0: none
    synthetic_negatives: int = 120
    oos_examples: tuple[str, ...] = ()
    embedder: EmbedderSettings = field(default_factory=EmbedderSettings)
    teacher: TeacherSettings = field(default_factory=TeacherSettings)
    thresholds: ThresholdSettings = field(default_factory=ThresholdSettings)
    followups: str = DEFAULT_FOLLOWUPS   # resolve | defer | off (classifier.settings.followups)
    source: str = "<memory>"

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(i.name for i in self.intents)

    def intent(self, name: str) -> Intent:
        for i in self.intents:
            if i.name == name:
                return i
        raise KeyError(name)

    def training_pairs(self) -> tuple[list[str], list[str | None]]:
        """Texts and labels (``None`` for out of scope) of all examples."""
        texts: list[str] = []
        labels: list[str | None] = []
        for i in self.intents:
            texts.extend(i.examples)
            labels.extend([i.name] * len(i.examples))
        texts.extend(self.oos_examples)
        labels.extend([None] * len(self.oos_examples))
        return texts, labels


def _read(path: Path) -> Any:
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise IntentFileError(str(path), "file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise IntentFileError(str(path), f"cannot read file: {exc}") from None
    try:
        if path.suffix.lower() == ".toml":
            return tomllib.loads(raw)
        return yaml.safe_load(raw)
    except (yaml.YAMLError, tomllib.TOMLDecodeError) as exc:
        kind = path.suffix.lstrip(".") or "YAML"
        raise IntentFileError(str(path), f"not valid {kind}: {_syntax_error(exc)}") from None


def _syntax_error(exc: Exception) -> str:
    """A parser's error on one line (PyYAML's spans several: context, problem, a snippet)."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        return f"{exc.context + ': ' if exc.context else ''}{exc.problem}{where}"
    return " ".join(str(exc).split())


def load_intents(path: str | Path) -> IntentSet:
    """Read and validate an intent definition file (``.yaml``, ``.yml`` or ``.toml``)."""
    p = Path(path)
    return parse_intents(_read(p), source=str(p))


class _Checker:
    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, problem: str, intent: str | None = None) -> IntentFileError:
        return IntentFileError(self.source, problem, intent)

    def mapping(self, value: Any, where: str, allowed: set[str], intent: str | None = None) -> dict:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(f"{where} must be a mapping, got {type(value).__name__}", intent)
        unknown = sorted(set(value) - allowed)
        if unknown:
            raise self.fail(f"unknown key {unknown[0]!r} in {where} (allowed: {', '.join(sorted(allowed))})", intent)
        return value

    def string_map(self, value: Any, where: str, intent: str | None = None) -> dict[str, str]:
        """A mapping of non-empty string keys to string values (numbers and booleans are
        refused, not converted: ``rag: false`` in YAML must be written ``rag: "false"``)."""
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(f"{where} must be a mapping of strings, got {type(value).__name__}", intent)
        for k, v in value.items():
            if not isinstance(k, str) or not k.strip():
                raise self.fail(f"{where} keys must be non-empty strings, got {k!r}", intent)
            if not isinstance(v, str):
                raise self.fail(f"{where}.{k} must be a string, got {v!r} (quote it)", intent)
        return {k.strip(): v for k, v in value.items()}

    def number(self, value: Any, where: str, lo: float, hi: float, intent: str | None = None) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(f"{where} must be a number, got {value!r}", intent)
        if not lo <= float(value) <= hi:
            raise self.fail(f"{where} must be between {lo} and {hi}, got {value!r}", intent)
        return float(value)

    def optional_number(self, value: Any, where: str, lo: float, hi: float, intent: str | None = None) -> float | None:
        # None means "learn it"; 0.0 is a real threshold and is kept as such.
        return None if value is None else self.number(value, where, lo, hi, intent)

    def integer(self, value: Any, where: str, lo: int, intent: str | None = None) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < lo:
            raise self.fail(f"{where} must be an integer >= {lo}, got {value!r}", intent)
        return value

    def texts(self, value: Any, where: str, intent: str | None = None) -> tuple[str, ...]:
        if value is None:
            return ()
        if not isinstance(value, list):
            raise self.fail(f"{where} must be a list of strings", intent)
        out = []
        for item in value:
            if not isinstance(item, str) or not item.strip():
                raise self.fail(f"{where} has an empty or non-string entry {item!r}", intent)
            out.append(item.strip())
        return tuple(out)


def _ambiguous_ratio(c: Any, th: dict[str, Any], source: str) -> float | None:
    """``thresholds.ambiguous_ratio``, or its old name ``ambiguous_margin`` (deprecated)."""
    if _OLD_RATIO_KEY not in th:
        return c.optional_number(th.get("ambiguous_ratio"), "thresholds.ambiguous_ratio", 0.0, 1.0)
    if "ambiguous_ratio" in th:
        raise c.fail("thresholds: give ambiguous_ratio only (ambiguous_margin is its old name)")
    log.warning("%s: thresholds.ambiguous_margin is deprecated; call it ambiguous_ratio (same meaning: "
                "the runner-up/top ratio that makes a result ambiguous)", source)
    return c.optional_number(th.get(_OLD_RATIO_KEY), "thresholds.ambiguous_margin", 0.0, 1.0)


def parse_intents(doc: Any, source: str = "<memory>") -> IntentSet:
    """Validate a parsed document (a dict) into an :class:`IntentSet`, section by section
    (each check raises :class:`IntentFileError` naming the file, the intent and the problem)."""
    c = _Checker(source)
    doc = c.mapping(doc, "the top level", _TOP_KEYS)
    if not doc:
        raise c.fail("the file is empty")
    if doc.get("version", 1) != 1:
        raise c.fail(f"unsupported version {doc.get('version')!r} (supported: 1)")
    intents = _intents(c, doc.get("intents"))
    seen = {i.name for i in intents}
    rules = _rules(c, doc.get("rules") or [], seen)
    oos_examples, synthetic = _out_of_scope(c, doc.get("out_of_scope"), intents)
    languages = _languages(c, doc.get("languages"))
    return IntentSet(name=str(doc.get("name") or Path(source).stem), intents=intents, rules=rules,
                     oos_examples=oos_examples, languages=languages, synthetic_negatives=synthetic,
                     embedder=_embedder(c, doc.get("embedder"), languages), teacher=_teacher(c, doc.get("teacher")),
                     thresholds=_thresholds(c, doc.get("thresholds"), intents, source), source=source,
                     followups=parse_followups(doc.get("followups"), source))


def _intents(c: _Checker, raw_intents: Any) -> tuple[Intent, ...]:
    """``intents``: a non-empty list of named intents, each with examples."""
    if not isinstance(raw_intents, list) or not raw_intents:
        raise c.fail("'intents' must be a non-empty list")
    intents: list[Intent] = []
    seen: set[str] = set()
    for n, raw in enumerate(raw_intents):
        name = raw.get("name") if isinstance(raw, dict) else None
        if not isinstance(name, str) or not name.strip():
            raise c.fail(f"intent #{n + 1} has no name")
        name = name.strip()
        raw = c.mapping(raw, "the intent", _INTENT_KEYS, name)
        if name in seen:
            raise c.fail("duplicate intent", name)
        _check_name(c, name, seen)
        seen.add(name)
        intents.append(_intent(c, name, raw))
    return tuple(intents)


def _intent(c: _Checker, name: str, raw: dict[str, Any]) -> Intent:
    examples = c.texts(raw.get("examples"), "examples", name)
    if not examples:
        raise c.fail("intent has no examples", name)
    th = c.mapping(raw.get("thresholds"), "thresholds", _PER_INTENT_KEYS, name)
    conf = c.optional_number(th.get("confident"), "thresholds.confident", 0.0, 1.0, name)
    desc = raw.get("description") or ""
    if not isinstance(desc, str):
        raise c.fail("description must be a string", name)
    return Intent(name=name, description=desc.strip(), examples=examples, confident=conf,
                  metadata=c.string_map(raw.get("metadata"), "metadata", name))


def _rules(c: _Checker, raw_rules: Any, seen: set[str]) -> tuple[Rule, ...]:
    """``rules``: each checked by :func:`_parse_rule`; ids unique."""
    rules = tuple(_parse_rule(c, r, n, seen) for n, r in enumerate(raw_rules))
    ids = [r.id for r in rules]
    dup = next((i for i in ids if ids.count(i) > 1), None)
    if dup is not None:
        raise c.fail(f"duplicate rule id {dup!r}")
    return rules


def _out_of_scope(c: _Checker, value: Any, intents: tuple[Intent, ...]) -> tuple[tuple[str, ...], int]:
    """``out_of_scope``: its examples and the number of synthetic negatives (a single
    intent needs one or the other)."""
    oos = c.mapping(value, "out_of_scope", _OOS_KEYS)
    oos_examples = c.texts(oos.get("examples"), "out_of_scope.examples")
    synthetic = c.integer(oos.get("synthetic", IntentSet.synthetic_negatives), "out_of_scope.synthetic", 0)
    if len(intents) == 1 and not oos_examples and synthetic == 0:
        raise c.fail("a single intent is trained against out of scope, and this file gives none: add "
                     "out_of_scope.examples (what the intent is not) or leave out_of_scope.synthetic above 0",
                     intents[0].name)
    return oos_examples, synthetic


def _embedder(c: _Checker, value: Any, languages: tuple[str, ...]) -> EmbedderSettings:
    """``embedder``: the backend (``auto``: from the languages), its runtime and settings."""
    e = c.mapping(value, "embedder", _EMBEDDER_KEYS)
    backend = e.get("backend") or "auto"
    if backend not in EMBEDDER_BACKENDS:
        raise c.fail(f"embedder.backend must be one of {', '.join(EMBEDDER_BACKENDS)}, got {backend!r}")
    spec = resolve_backend(backend, languages)   # auto: from the languages
    runtime = e.get("runtime") or "auto"
    if runtime not in EMBEDDER_RUNTIMES:
        raise c.fail(f"embedder.runtime must be one of {', '.join(EMBEDDER_RUNTIMES)}, got {runtime!r}")
    if runtime not in spec.runtimes:
        raise c.fail(f"embedder.runtime {runtime!r} does not apply to the {spec.id} backend "
                     f"(a {spec.engine} forward pass): leave it unset or {' or '.join(map(repr, spec.runtimes))}")
    return EmbedderSettings(
        backend=spec.id,
        model=e.get("model"),
        batch_size=c.integer(e.get("batch_size", EmbedderSettings.batch_size), "embedder.batch_size", 1),
        max_chars=c.integer(e.get("max_chars", EmbedderSettings.max_chars), "embedder.max_chars", 1),
        device=e.get("device"),
        use_fp16=bool(e.get("use_fp16", EmbedderSettings.use_fp16)),
        quantize=_quantize(c, e.get("quantize")),
        num_threads=None if e.get("num_threads") is None else c.integer(e["num_threads"], "embedder.num_threads", 1),
        layers=_layers(c, e.get("layers")),
        runtime=runtime,
        tune=_tune(c, e.get("tune")),
        tune_off=e.get("tune") in (False, "off"),
    )


def retrain_tuning(e: EmbedderSettings) -> tuple[TuneSettings | None, str]:
    """What ``flywheel retrain`` tunes with when no ``--tune-encoder``/``--no-tune-encoder``
    says (:func:`training.options.resolve_tune` gets the first element), and why, in words
    for its report: the file's ``embedder.tune``; off where the file says ``tune: off``;
    else on, with the defaults, for the backends in :data:`TUNED_BY_DEFAULT` (MiniLM without
    ``layers``: tuning pools the last layer only); else off (the backend cannot be tuned).

    >>> retrain_tuning(EmbedderSettings())[0] == TuneSettings()    # MiniLM, the default
    True
    >>> retrain_tuning(EmbedderSettings(tune_off=True))
    (None, 'off: the intent file says embedder.tune: off')
    """
    if e.tune is not None:
        return e.tune, "on: the intent file's embedder.tune"
    if e.tune_off:
        return None, "off: the intent file says embedder.tune: off"
    if e.backend in TUNED_BY_DEFAULT and not e.layers:
        return TuneSettings(), f"on by default ({e.backend} can be tuned; embedder.tune: off or --no-tune-encoder " \
                               "turns it off)"
    why = "embedder.layers is set (tuning pools the last layer only)" if e.layers else \
        f"{e.backend} cannot be tuned in place"
    return None, f"off: {why}"


def _teacher(c: _Checker, value: Any) -> TeacherSettings:
    """``teacher``: the backend and its limits (never an API key)."""
    if isinstance(value, dict) and "api_key" in value:  # never echo its value
        raise c.fail("teacher.api_key is not read from an intent file (it would be a secret in a "
                     "versioned file): set the OPENAI_API_KEY environment variable instead")
    t = c.mapping(value, "teacher", _TEACHER_KEYS)
    td = TeacherSettings   # the one owner of every default below
    return TeacherSettings(
        backend=_choice(c, t.get("backend", td.backend), "teacher.backend", TEACHER_BACKENDS),
        model=str(t.get("model", td.model)),
        host=t.get("host"),
        timeout_s=c.number(t.get("timeout_s", td.timeout_s), "teacher.timeout_s", 0.001, 600),
        max_candidates=c.integer(t.get("max_candidates", td.max_candidates), "teacher.max_candidates", 1),
        examples_per_intent=c.integer(t.get("examples_per_intent", td.examples_per_intent),
                                      "teacher.examples_per_intent", 0),
        history_size=c.integer(t.get("history_size", td.history_size), "teacher.history_size", 0),
        breaker_failures=c.integer(t.get("breaker_failures", td.breaker_failures), "teacher.breaker_failures", 1),
        breaker_reset_s=c.number(t.get("breaker_reset_s", td.breaker_reset_s), "teacher.breaker_reset_s", 0.0, 86400),
        confidence=c.number(t.get("confidence", td.confidence), "teacher.confidence", 0.0, 1.0),
        max_calls_per_minute=_optional_count(c, t, "max_calls_per_minute"),
        daily_budget=_optional_count(c, t, "daily_budget"),
        keep_alive=_keep_alive(c, t.get("keep_alive", td.keep_alive)),
        system_prompt=_choice(c, t.get("system_prompt", td.system_prompt), "teacher.system_prompt",
                              SYSTEM_PROMPT_MODES),
        response_format=_choice(c, t.get("response_format", td.response_format), "teacher.response_format",
                                TEACHER_RESPONSE_FORMATS),
        cache_size=c.integer(t.get("cache_size", td.cache_size), "teacher.cache_size", 0),
        cache_ttl_s=c.number(t.get("cache_ttl_s", td.cache_ttl_s), "teacher.cache_ttl_s", 1.0, 365 * 86400.0),
        ask_twice=_flag(c, t.get("ask_twice", td.ask_twice), "teacher.ask_twice"),
    )


def _thresholds(c: _Checker, value: Any, intents: tuple[Intent, ...], source: str) -> ThresholdSettings:
    """``thresholds``: the cutoffs, and per intent its ``confident`` (from ``per_intent`` or
    the intent's own ``thresholds``)."""
    seen = {i.name for i in intents}
    th = c.mapping(value, "thresholds", _THRESHOLD_KEYS)
    per = c.mapping(th.get("per_intent"), "thresholds.per_intent", seen | set(th.get("per_intent") or {}))
    per_intent: dict[str, float] = {}
    for name, v in per.items():
        if name not in seen:
            raise c.fail(f"thresholds.per_intent names an unknown intent {name!r}{_did_you_mean(name, seen)}")
        if isinstance(v, dict):
            v = c.mapping(v, "thresholds.per_intent", _PER_INTENT_KEYS, name).get("confident")
        per_intent[name] = c.number(v, "thresholds.per_intent", 0.0, 1.0, name)
    for i in intents:
        if i.confident is not None:
            per_intent.setdefault(i.name, i.confident)
    try:
        target = threshold_target(th)
    except ValueError as exc:
        raise c.fail(f"thresholds.target: {exc}") from None
    return ThresholdSettings(
        confident=c.optional_number(th.get("confident"), "thresholds.confident", 0.0, 1.0),
        ambiguous_ratio=_ambiguous_ratio(c, th, source),
        oos=c.optional_number(th.get("oos"), "thresholds.oos", 0.0, 1.0),
        target_precision=c.number((target or {}).get("precision", th.get(
            "target_precision", ThresholdSettings.target_precision)), "thresholds.target_precision", 0.0, 1.0),
        target=target,
        per_intent=per_intent,
        coverage=c.number(th.get("coverage", ThresholdSettings.coverage), "thresholds.coverage", 0.5, 0.999),
        deferral=_choice(c, th.get("deferral", ThresholdSettings.deferral), "thresholds.deferral", DEFERRAL_RULES),
    )


def _check_name(c: _Checker, name: str, seen: set[str]) -> None:
    """Refuse an intent name that reads as out of scope (:data:`~classifier.settings.label_names.OUT_OF_SCOPE_NAMES`,
    any case) or that differs only in case from an earlier one (``book``, ``Book``): a label
    given in the wrong case is answered "did you mean ...", which must name one intent."""
    if name.upper() in OUT_OF_SCOPE_NAMES:
        raise c.fail(f"the name {name!r} means out of scope in flywheel ({', '.join(sorted(OUT_OF_SCOPE_NAMES))}, "
                     "any case): put these examples under out_of_scope.examples, or rename the intent", name)
    twin = next((s for s in seen if s.casefold() == name.casefold()), None)
    if twin is not None:
        raise c.fail(f"intents {twin!r} and {name!r} differ only in case: merge them or rename one", name)


def _did_you_mean(name: Any, intents: set[str]) -> str:
    """``" (did you mean X?)"`` for the intent ``name`` was probably meant to be, else ``""``."""
    hint = suggest_label(name, sorted(intents)) if isinstance(name, str) else None
    return f" (did you mean {hint}?)" if hint else ""


def _optional_count(c: _Checker, t: dict[str, Any], key: str) -> int | None:
    """``teacher.<key>``: a positive integer, or ``None`` (absent or null: no limit)."""
    value = t.get(key)
    return None if value is None else c.integer(value, f"teacher.{key}", 1)


def _choice(c: _Checker, value: Any, where: str, allowed: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise c.fail(f"{where} must be one of {', '.join(allowed)}, got {value!r}")
    return value


def _keep_alive(c: _Checker, value: Any) -> str:
    """``teacher.keep_alive``: a duration string, or a number of seconds (negative: forever)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{int(value)}s" if float(value).is_integer() else f"{round(value * 1000)}ms"
    if not isinstance(value, str) or not _DURATION.match(value.strip()):
        raise c.fail(f"teacher.keep_alive must be a duration such as 30m, 1h or -1s (forever), "
                     f"or a number of seconds, got {value!r}")
    return value.strip()


def _tune(c: _Checker, value: Any) -> TuneSettings | None:
    """``embedder.tune``: ``true``/``on``, ``false``/``off`` (``None``: see
    :func:`retrain_tuning`), or a mapping of :class:`TuneSettings` fields (checked by
    :class:`TuneSettings` itself, the one place)."""
    if value is None or value is False or value == "off":
        return None
    if value is True or value == "on":
        return TuneSettings()
    if isinstance(value, str):
        raise c.fail(f"embedder.tune must be on, off, or a mapping of tuning settings, got {value!r}")
    t = c.mapping(value, "embedder.tune", _TUNE_KEYS)
    try:
        return TuneSettings(**t)
    except TuneSettingsError as exc:
        raise c.fail(f"embedder.{exc}") from None


def _flag(c: _Checker, value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise c.fail(f"{where} must be true or false, got {value!r}")
    return value


def _quantize(c: _Checker, value: Any) -> bool | None:
    if value is None or value == "auto":
        return None
    if not isinstance(value, bool):
        raise c.fail(f"embedder.quantize must be true, false or auto, got {value!r}")
    return value


def _languages(c: _Checker, value: Any) -> tuple[str, ...]:
    """``languages``: the language codes the examples cover (ISO 639, e.g. ``[en, es]``)."""
    if value is None:
        return ("en",)
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise c.fail(f"languages must be a non-empty list of language codes such as [en, es], got {value!r}")
    out = []
    for code in value:
        if not isinstance(code, str) or not _LANGUAGE.match(code.strip().lower()):
            raise c.fail(f"languages has {code!r}, which is not a language code such as 'en' or 'es'")
        out.append(code.strip().lower())
    return tuple(dict.fromkeys(out))


def _layers(c: _Checker, value: Any) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not value or not all(isinstance(i, int) and not isinstance(i, bool)
                                                           and i >= 0 for i in value):
        raise c.fail(f"embedder.layers must be a non-empty list of layer numbers, got {value!r}")
    return tuple(value)


def _parse_rule(c: _Checker, raw: Any, n: int, intents: set[str]) -> Rule:
    if not isinstance(raw, dict):
        raise c.fail(f"rule #{n + 1} must be a mapping")
    rid = raw.get("id") or f"rule-{n + 1}"
    intent = raw.get("intent")
    c.mapping(raw, f"rule {rid!r}", _RULE_KEYS, intent if isinstance(intent, str) else None)
    if intent not in intents:
        raise c.fail(f"rule {rid!r} names an unknown intent{_did_you_mean(intent, intents)}", str(intent))
    kinds = [k for k in RULE_KINDS if k in raw]
    if len(kinds) != 1:
        raise c.fail(f"rule {rid!r} must have exactly one of {', '.join(RULE_KINDS)}", intent)
    kind = kinds[0]
    value = raw[kind]
    if kind == "keywords":
        # A list of keyword sets; a rule matches when every word of any one set occurs.
        sets = value if isinstance(value, list) and value and isinstance(value[0], list) else [value]
        patterns = []
        for s in sets:
            if not isinstance(s, list) or not s or not all(isinstance(w, str) and w.strip() for w in s):
                raise c.fail(f"rule {rid!r}: keywords must be a list of words or a list of word lists", intent)
            patterns.append(frozenset(w.strip().lower() for w in s))
        pats: tuple[Any, ...] = tuple(patterns)
    else:
        values = value if isinstance(value, list) else [value]
        if not values or not all(isinstance(v, str) and v for v in values):
            raise c.fail(f"rule {rid!r}: {kind} must be a non-empty string or list of strings", intent)
        if kind == "regex":
            for v in values:
                try:
                    re.compile(v)
                except re.error as exc:
                    raise c.fail(f"rule {rid!r}: invalid regex {v!r}: {exc}", intent) from None
        pats = tuple(values)
    priority = c.integer(raw.get("priority", 0), f"rule {rid!r} priority", -(10**9), intent)
    return Rule(id=str(rid), intent=intent, priority=priority, kind=kind, patterns=pats,
                description=str(raw.get("description") or ""))
