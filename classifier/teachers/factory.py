"""Building the teacher from settings: :func:`build_teacher`.

Reads the resolved :class:`~classifier.settings.config.Config` (flags, environment, config file)
and the intent set's ``teacher`` section, picks the backend
(:mod:`~classifier.teachers.ollama` or :mod:`~classifier.teachers.openai`) and puts it
behind the call budget (:mod:`~classifier.teachers.budget`). Nothing is connected here.
"""

from __future__ import annotations

from pathlib import Path

from flywheel.classifier.errors import ConfigError
from flywheel.classifier.protocols import Teacher
from flywheel.classifier.settings.config import Config
from flywheel.classifier.settings.intents import IntentSet
from flywheel.classifier.teachers.base import CircuitBreaker
from flywheel.classifier.teachers.budget import apply_budget
from flywheel.classifier.teachers.ollama import OllamaTeacher
from flywheel.classifier.teachers.openai import OpenAITeacher

__all__ = ["build_teacher"]


def build_teacher(cfg: Config, intents: IntentSet) -> Teacher | None:
    """The teacher ``cfg`` and the intent set's ``teacher`` section describe (``None`` when
    ``teacher = off``); flags, environment and config file win over the intent file. The
    backend is ``cfg.teacher`` when that names one (``ollama``, ``openai``), else (``on``) the
    intent file's ``teacher.backend``: ``ollama`` or ``openai``. Its host is the configured one
    (:meth:`~classifier.settings.config.Config.teacher_host_for`: ``teacher_host``, and for ``ollama``
    also ``ollama_host``), else ``teacher.host``, else for ``ollama``
    :func:`~classifier.teachers.ollama.resolve_host`'s ``OLLAMA_HOST`` and default (``openai``
    has no default: a missing one is a :class:`~classifier.errors.ConfigError`); ``teacher.host``
    counts only for the backend the intent file names. The teacher is behind the intent
    file's call budget when it sets one (:func:`~classifier.teachers.budget.apply_budget`). No
    connection is made."""
    if cfg.teacher == "off":
        return None
    t = intents.teacher
    model = cfg.teacher_model or t.model
    timeout_s = cfg.teacher_timeout_s if cfg.teacher_timeout_s is not None else t.timeout_s
    breaker = CircuitBreaker(t.breaker_failures, t.breaker_reset_s)
    backend = t.backend if cfg.teacher == "on" else cfg.teacher
    file_host = t.host if backend == t.backend else None   # the intent file's host is its own backend's
    host = cfg.teacher_host_for(backend) or file_host
    if backend == "openai":
        if not host or not str(host).strip():
            raise ConfigError(f"{_intent_file(cfg, intents)}: the openai teacher needs the server's base URL: set "
                              "teacher.host (e.g. http://127.0.0.1:8000/v1), FLYWHEEL_TEACHER_HOST or "
                              "--teacher-host")
        teacher: Teacher = OpenAITeacher(model=model, host=str(host), timeout_s=timeout_s, breaker=breaker,
                                         response_format=t.response_format, system_prompt=t.system_prompt)
    else:
        teacher = OllamaTeacher(model=model, host=host, timeout_s=timeout_s,
                                breaker=breaker, keep_alive=t.keep_alive, system_prompt=t.system_prompt)
    return apply_budget(teacher, t)   # max_calls_per_minute / daily_budget, per process


def _intent_file(cfg: Config, intents: IntentSet) -> str:
    """The intent file a person edits for ``intents``: the configured one (``cfg.intents``),
    not the copy a model version or the default model's cache holds (``intents.source`` of a
    loaded model), else the set's own source."""
    return str(Path(cfg.intents).expanduser()) if cfg.intents else intents.source
