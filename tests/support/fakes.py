"""Test doubles: a deterministic embedder, a scripted teacher, a log sink that keeps
records in a list, and a classifier built from them.

- :class:`HashEmbedder` stands in for every encoder (no model, no download).
- :class:`ScriptedTeacher` answers from a function of the request, or raises (a
  :class:`~classifier.protocols.ManagedTeacher`: always ready, no breaker, nothing to close).
- :class:`ListSink` is a ``log_sink`` that keeps what it was given.
- :func:`make_classifier` fits :data:`tests.support.docs.DOC` (or another intent
  document) on a HashEmbedder and wraps it in a real :class:`classifier.Classifier`.
"""

from __future__ import annotations

import copy
import hashlib
import re
import threading
import time
from typing import Sequence

import numpy as np

from flywheel.classifier import Classifier
from flywheel.classifier.errors import TeacherError
from flywheel.classifier.layer2.fitter import fit_model
from flywheel.classifier.protocols import TeacherAnswer, TeacherRequest, TeacherStatus
from flywheel.classifier.settings.intents import parse_intents
from flywheel.classifier.settings.label_names import OUT_OF_SCOPE
from tests.support.docs import DOC

_WORD = re.compile(r"\w+")


class HashEmbedder:
    """Hashes words into ``dim`` buckets and L2-normalises: an encoder without a model.

    Two flavours:

    - the default: words and word bigrams, each adding +1 or -1 (a bit of its hash) to the
      bucket the first 32 bits of its MD5 pick; a text whose vector is zero gets a one-hot
      vector (bucket ``i % dim`` for the i-th text). The id is ``fake:hash-256`` unless given.
    - ``bag_of_words=True``: a plain bag of words, each word adding +1 to the bucket its
      whole MD5 picks, no bigrams; a text without words gets bucket 0 (the toy topics of
      tests/training/test_evaluate.py are separated by this one).

    ``calls`` counts ``encode`` calls and ``texts_seen`` the texts encoded.
    """

    def __init__(self, dim: int = 256, id: str = "fake:hash-256", *, bag_of_words: bool = False) -> None:
        self._dim = dim
        self._id = id
        self._bag_of_words = bag_of_words
        self.calls = 0
        self.texts_seen = 0

    @property
    def id(self) -> str:
        return self._id

    @property
    def dim(self) -> int:
        return self._dim

    def encode(self, texts: Sequence[str], *, batch_size: int | None = None, progress: bool = False) -> np.ndarray:
        self.calls += 1
        self.texts_seen += len(texts)
        out = np.zeros((len(texts), self._dim), dtype=np.float32)
        for i, t in enumerate(texts):
            words = _WORD.findall(t.lower())
            if self._bag_of_words:
                for w in words:
                    out[i, int(hashlib.md5(w.encode()).hexdigest(), 16) % self._dim] += 1.0
                if not out[i].any():
                    out[i, 0] = 1.0
                out[i] /= np.linalg.norm(out[i])
                continue
            for tok in words + [a + "_" + b for a, b in zip(words, words[1:])]:
                h = int(hashlib.md5(tok.encode()).hexdigest()[:8], 16)
                out[i, h % self._dim] += 1.0 if (h >> 20) & 1 else -1.0
            n = np.linalg.norm(out[i])
            out[i] = out[i] / n if n > 0 else np.eye(1, self._dim, i % self._dim)
        return out


class ScriptedTeacher:
    """Answers from a function of the request (default: the first option offered), or
    raises a scripted TeacherError; ``delay_s`` before answering. Remembers every request.

    The function returns a label (``None`` or ``OUT_OF_SCOPE``: out of scope), a list or tuple of labels (the
    teacher is unsure between them: a candidate set) or :data:`CANNOT_TELL`.

    A :class:`~classifier.protocols.ManagedTeacher`: ``check()`` is always ready, ``close()``
    does nothing and ``breaker`` is ``None`` (a test may set one)."""

    breaker = None
    CANNOT_TELL = object()

    def __init__(self, answer=None, error: TeacherError | None = None, delay_s: float = 0.0,
                 model: str = "fake-llm") -> None:
        self.answer = answer or (lambda req: req.options[0].name)
        self.error = error
        self.delay_s = delay_s
        self._model = model
        self.requests: list[TeacherRequest] = []
        self._lock = threading.Lock()

    @property
    def model(self) -> str:
        return self._model

    def label(self, request: TeacherRequest) -> TeacherAnswer:
        with self._lock:
            self.requests.append(request)
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.error is not None:
            raise self.error
        got = self.answer(request)
        if got is ScriptedTeacher.CANNOT_TELL:
            return TeacherAnswer(None, self._model, self.delay_s * 1000, cannot_tell=True)
        if isinstance(got, (list, tuple)):   # OUT_OF_SCOPE reads as None, as a real teacher's answer
            cands = tuple(None if g == OUT_OF_SCOPE else g for g in got)
            return TeacherAnswer(cands[0], self._model, self.delay_s * 1000, candidates=cands)
        return TeacherAnswer(None if got == OUT_OF_SCOPE else got, self._model, self.delay_s * 1000)

    def check(self) -> TeacherStatus:
        return TeacherStatus(True, f"scripted teacher {self._model!r}: no server to check")

    def close(self) -> None:
        pass


class ListSink:
    """A decision-log sink that keeps every record it is given in ``records`` (thread-safe)."""

    def __init__(self) -> None:
        self.records = []
        self.lock = threading.Lock()

    def write(self, record) -> None:
        with self.lock:
            self.records.append(record)

    def close(self) -> None:
        pass


def make_classifier(thresholds=None, teacher=None, embedder=None, doc=DOC, **kw):
    """A real Classifier fitted on ``doc`` (a copy; ``thresholds`` replace its own) with
    ``embedder`` (a new HashEmbedder by default); ``kw`` go to Classifier."""
    d = copy.deepcopy(doc)
    if thresholds:
        d["thresholds"] = thresholds
    emb = embedder or HashEmbedder()
    model = fit_model(parse_intents(d), embedder=emb)
    return Classifier(model, embedder=emb, teacher=teacher, **kw)
