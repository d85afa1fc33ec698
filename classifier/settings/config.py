"""Configuration with the precedence flag > environment variable > config file > default.

The config file is TOML at ``$FLYWHEEL_CONFIG`` or ``<home>/config.toml``; the home
directory is ``$FLYWHEEL_HOME`` or the user data directory (platformdirs).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from importlib.resources import files
from pathlib import Path
from typing import Any, TypedDict, Unpack

from flywheel.classifier.errors import ConfigError

ENV = {
    "home": "FLYWHEEL_HOME",
    "model": "FLYWHEEL_MODEL",
    "intents": "FLYWHEEL_INTENTS",
    "log_db": "FLYWHEEL_LOG_DB",
    "teacher": "FLYWHEEL_TEACHER",
    "ollama_host": "OLLAMA_HOST",
    "teacher_host": "FLYWHEEL_TEACHER_HOST",
    "teacher_model": "FLYWHEEL_TEACHER_MODEL",
    "teacher_timeout_s": "FLYWHEEL_TEACHER_TIMEOUT",
    "audit_rate": "FLYWHEEL_AUDIT_RATE",
    "store": "FLYWHEEL_STORE",
    "replica": "FLYWHEEL_REPLICA",
    "store_poll_s": "FLYWHEEL_STORE_POLL",
    "ship_interval_s": "FLYWHEEL_SHIP_INTERVAL",
    "spool_max_mb": "FLYWHEEL_SPOOL_MAX_MB",
    "log_retention_days": "FLYWHEEL_LOG_RETENTION_DAYS",
    "mask_pii": "FLYWHEEL_MASK_PII",
    "shadow_fraction": "FLYWHEEL_SHADOW_FRACTION",
    "tune_encoder": "FLYWHEEL_TUNE_ENCODER",
    "serve_last_good": "FLYWHEEL_SERVE_LAST_GOOD",
}
_FLOATS = {"teacher_timeout_s", "audit_rate", "store_poll_s", "ship_interval_s", "spool_max_mb",
           "log_retention_days", "shadow_fraction"}
_BOOLS = {"mask_pii", "tune_encoder", "serve_last_good"}
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")
#: What the ``teacher`` setting may be: ``on`` (the intent file's ``teacher.backend``),
#: ``ollama`` or ``openai`` (that backend, whatever the intent file says), ``off`` (no layer 3).
TEACHER_CHOICES = ("on", "ollama", "openai", "off")
#: The help text of every command's ``--teacher`` option.
TEACHER_HELP = "on (the intent file's teacher.backend) | ollama | openai (that backend) | off"
#: The help text of every command's ``--teacher-host`` option (alias ``--ollama-host``): the
#: flag sets ``teacher_host``, the teacher's host for whichever backend is used.
TEACHER_HOST_HELP = "The teacher's host, for either backend (an openai base URL ends in /v1)."
#: The help text of every command's ``--home`` option.
HOME_HELP = "flywheel home (default: $FLYWHEEL_HOME or the user data dir)"


def default_home() -> Path:
    from platformdirs import user_data_dir

    return Path(user_data_dir("flywheel", appauthor=False))


def cache_dir(kind: str, root: str | os.PathLike[str] | None = None) -> Path:
    """``<root>/<kind>``: where an encoder keeps what it builds once per home (the parsed
    USE tokenizer). ``root`` is a resolved home's :attr:`Config.cache_root`; without
    one, ``<home>/cache`` for the home the environment gives (``$FLYWHEEL_HOME``, else the
    user data dir), which knows nothing of a ``--home`` flag."""
    if root is None:
        home = os.environ.get(ENV["home"])
        root = (Path(home).expanduser() if home else default_home()) / "cache"
    return Path(root).expanduser() / kind


def starter_intents_path() -> Path:
    """The starter intent set that ships as package data in ``classifier/data/``."""
    return Path(str(files("flywheel.classifier") / "data" / "starter_intents.yaml"))


@dataclass
class Config:
    home: Path
    model: str | None = None          # a model version dir, or a models home with CURRENT
    intents: str | None = None        # intent file for the default model
    log_db: str | None = None         # None: <home>/log/flywheel.duckdb
    teacher: str = "on"               # see TEACHER_CHOICES
    teacher_host: str | None = None   # the teacher's host, either backend (over the intent file's teacher.host)
    ollama_host: str | None = None    # the ollama backend's host only, under teacher_host (OLLAMA_HOST)
    teacher_model: str | None = None
    teacher_timeout_s: float | None = None
    audit_rate: float = 0.02
    # fleet mode (see fleet/): the shared object store, s3://BUCKET/PREFIX; credentials and the
    # endpoint come only from the standard AWS_* environment variables, never from this file
    store: str | None = None
    replica: str | None = None        # signs this host's moves of the fleet's pointers (default: user@host)
    store_poll_s: float = 5.0         # how often a replica checks the fleet's CURRENT model
    ship_interval_s: float = 5.0      # how often finished log segments are shipped to the store
    spool_max_mb: float = 256.0       # unshipped log kept on local disk at most; past it, batches are dropped
    log_retention_days: float | None = None   # raw query text older than this is deleted by the retrain
    mask_pii: bool = False            # mask e-mails, phones, cards, IBANs in logged text (classifier.masking)
    shadow_fraction: float = 1.0      # share of layer-2 traffic a shadow version scores (0: never load one)
    # the retrain's encoder tuning (--tune-encoder/--no-tune-encoder); None: the intent file's
    # embedder.tune, which left out is on where the encoder can be tuned (intents.retrain_tuning)
    tune_encoder: bool | None = None
    # start serving the models home's CURRENT even when neither it nor any stored version was
    # trained on the configured intents file (loud log line, metric); off: such a start exits 2
    serve_last_good: bool = False
    sources: dict[str, str] = field(default_factory=dict)  # key -> flag|env|file|default

    @property
    def models_dir(self) -> Path:
        return self.home / "models"

    @property
    def cache_root(self) -> Path:
        """``<home>/cache``: the default model trained on first use and the parsed ``use/``
        tokenizer (ONNX exports are shared by every home: ``onnx_runner.default_cache_dir``)."""
        return self.home / "cache"

    def teacher_host_for(self, backend: str) -> str | None:
        """The configured host of the ``backend`` teacher (``None``: the intent file's
        ``teacher.host``, else the backend's default): ``teacher_host`` (``--teacher-host``,
        ``FLYWHEEL_TEACHER_HOST``), for either backend; for ``ollama``, ``ollama_host``
        (``OLLAMA_HOST``) too, where it comes from a higher source (flag > env > file) than
        ``teacher_host``, and from the same one it yields."""
        if backend != "ollama" or self.ollama_host is None:
            return self.teacher_host
        if self.teacher_host is None:
            return self.ollama_host
        rank = ("flag", "env", "file").index
        ollama_first = rank(self.sources.get("ollama_host", "file")) < rank(self.sources.get("teacher_host", "file"))
        return self.ollama_host if ollama_first else self.teacher_host

    @property
    def log_path(self) -> Path:
        return Path(self.log_db) if self.log_db else self.home / "log" / "flywheel.duckdb"


class ConfigFlags(TypedDict, total=False):
    """What :func:`load_config` takes: one flag per :class:`Config` setting, ``None`` = not given."""

    home: str | os.PathLike[str] | None
    model: str | None
    intents: str | None
    log_db: str | None
    teacher: str | None
    teacher_host: str | None
    ollama_host: str | None
    teacher_model: str | None
    teacher_timeout_s: float | None
    audit_rate: float | None
    store: str | None
    replica: str | None
    store_poll_s: float | None
    ship_interval_s: float | None
    spool_max_mb: float | None
    log_retention_days: float | None
    mask_pii: bool | None
    shadow_fraction: float | None
    tune_encoder: bool | None
    serve_last_good: bool | None


def load_config(**flags: Unpack[ConfigFlags]) -> Config:
    """Resolve every setting; ``flags`` holds command-line values (``None`` = not given), one
    per setting (:class:`ConfigFlags`). An unknown flag is refused with a :class:`TypeError`
    that names it and lists the known ones (a misspelt flag would change nothing)."""
    _check_flags(flags)
    env_home = os.environ.get(ENV["home"])
    home = Path(flags.get("home") or env_home or default_home()).expanduser()
    cfg_path = Path(os.environ.get("FLYWHEEL_CONFIG") or home / "config.toml")
    file_values: dict[str, Any] = {}
    if cfg_path.is_file():
        try:
            file_values = tomllib.loads(cfg_path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{cfg_path}: invalid config file: {exc}") from None
        known = {f.name for f in fields(Config)} - {"sources", "home"}
        unknown = sorted(set(file_values) - known)
        if unknown:
            raise ConfigError(f"{cfg_path}: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")
    values: dict[str, Any] = {"home": home}
    sources = {"home": "flag" if flags.get("home") else "env" if env_home else "default"}
    given: dict[str, Any] = dict(flags)
    for f in fields(Config):
        if f.name in ("home", "sources"):
            continue
        if given.get(f.name) is not None:
            v, src = given[f.name], "flag"
        elif ENV.get(f.name) and os.environ.get(ENV[f.name]) not in (None, ""):
            v, src = os.environ[ENV[f.name]], "env"
        elif f.name in file_values:
            v, src = file_values[f.name], "file"
        else:
            continue
        if f.name in _FLOATS:
            try:
                v = float(v)
            except (TypeError, ValueError):
                raise ConfigError(f"{f.name} must be a number, got {v!r} (from {src})") from None
        elif f.name in _BOOLS:
            v = _boolean(f.name, v, src)
        values[f.name] = v
        sources[f.name] = src
    cfg = Config(**values, sources=sources)
    cfg.teacher = str(cfg.teacher).strip().lower()
    if cfg.teacher not in TEACHER_CHOICES:
        raise ConfigError(f"teacher must be one of {', '.join(TEACHER_CHOICES)}, got {values.get('teacher')!r} "
                          f"(from {sources.get('teacher', 'default')})")
    for name in ("audit_rate", "shadow_fraction"):
        if not 0.0 <= getattr(cfg, name) <= 1.0:
            raise ConfigError(f"{name} must be between 0 and 1, got {getattr(cfg, name)}")
    for name in ("store_poll_s", "ship_interval_s", "spool_max_mb"):
        if not getattr(cfg, name) > 0:
            raise ConfigError(f"{name} must be > 0, got {getattr(cfg, name)}")
    if cfg.log_retention_days is not None and not cfg.log_retention_days >= 0:
        raise ConfigError(f"log_retention_days must be >= 0, got {cfg.log_retention_days}")
    if cfg.store is not None and not str(cfg.store).startswith("s3://"):
        raise ConfigError(f"store must be an s3://BUCKET/PREFIX URL, got {cfg.store!r}")
    for name in ("teacher_host", "ollama_host"):   # the teacher's address: its port in range, when it has one
        _check_host_port(name, getattr(cfg, name), sources.get(name, "default"))
    return cfg


def _check_flags(flags: Mapping[str, object]) -> None:
    """Raise :class:`TypeError` for a flag :func:`load_config` does not know, naming it, the
    nearest known flag and all of them."""
    import difflib

    known = sorted(ConfigFlags.__annotations__)
    unknown = sorted(set(flags) - set(known))
    if unknown:
        near = difflib.get_close_matches(unknown[0], known, n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        raise TypeError(f"load_config() got an unknown flag {unknown[0]!r}{hint} (known: {', '.join(known)})")


def _check_host_port(name: str, value: Any, src: str) -> None:
    """Refuse a host (``http://HOST:PORT/...``, or ``HOST:PORT`` as ``OLLAMA_HOST`` may be)
    whose port is not a whole number from 0 to :data:`MAX_PORT`."""
    from urllib.parse import urlsplit

    text = str(value or "").strip()
    if not text:
        return
    try:
        urlsplit(text if "://" in text else f"http://{text}").port
    except ValueError as exc:   # urllib's reason: "Port out of range 0-65535", "Port could not be cast..."
        raise ConfigError(f"{name} {text!r} (from {src}) is not a usable address: {exc}") from None


def _boolean(name: str, v: Any, src: str) -> bool:
    if isinstance(v, bool):
        return v
    text = str(v).strip().lower()
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise ConfigError(f"{name} must be true or false, got {v!r} (from {src})")


