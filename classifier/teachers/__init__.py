"""Layer 3: the LLM teachers that label what layer 2 is unsure of, each a
:class:`~classifier.protocols.ManagedTeacher`, and their call budget. Importing any module
here connects to nothing and imports no client (``ollama``, ``httpx``): a teacher creates
its client on its first call.

>>> from flywheel.classifier.settings.config import load_config, starter_intents_path      # doctest: +SKIP
>>> from flywheel.classifier.settings.intents import load_intents                          # doctest: +SKIP
>>> from flywheel.classifier.teachers import build_teacher                        # doctest: +SKIP
>>> teacher = build_teacher(load_config(), load_intents(starter_intents_path()))  # doctest: +SKIP
>>> teacher.check().ok   # the first call that reaches the server; never raises   # doctest: +SKIP
True

Modules: :mod:`~classifier.teachers.base` (what every backend shares: the prompt, the
answer schema and parser, the :class:`CircuitBreaker` and :class:`ChatTeacher`, the base
that runs one call through it), :mod:`~classifier.teachers.ollama` (:class:`OllamaTeacher`),
:mod:`~classifier.teachers.openai` (:class:`OpenAITeacher`, any OpenAI-compatible server),
:mod:`~classifier.teachers.budget` (:class:`BudgetedTeacher`: at most so many calls a
minute and a UTC day), :mod:`~classifier.teachers.cache` (:class:`TeacherCache`: answers
already given, served again without a call) and :mod:`~classifier.teachers.factory`
(:func:`build_teacher`: settings to teacher).
"""

from __future__ import annotations

from flywheel.classifier.teachers.base import (
    HISTORY_RULE,
    ChatTeacher,
    CircuitBreaker,
    build_messages,
    offered_options,
    option_order,
    parse_answer,
    read_answer,
    redact_url,
    response_schema,
    shorten,
)
from flywheel.classifier.teachers.budget import BudgetedTeacher, CallBudget, Slot, apply_budget
from flywheel.classifier.teachers.cache import TeacherCache
from flywheel.classifier.teachers.factory import build_teacher
from flywheel.classifier.teachers.ollama import DEFAULT_HOST, OllamaTeacher, resolve_host
from flywheel.classifier.teachers.openai import API_KEY_ENV, OpenAITeacher

__all__ = ["API_KEY_ENV", "DEFAULT_HOST", "HISTORY_RULE", "BudgetedTeacher", "CallBudget", "ChatTeacher",
           "CircuitBreaker", "OllamaTeacher", "OpenAITeacher", "Slot", "TeacherCache", "apply_budget",
           "build_messages", "build_teacher", "offered_options", "option_order", "parse_answer", "read_answer",
           "redact_url", "response_schema", "resolve_host", "shorten"]
