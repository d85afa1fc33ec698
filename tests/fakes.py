"""Test doubles: a deterministic bag-of-words embedder and scripted teachers."""

from __future__ import annotations

import hashlib
import re
import threading
import time
from typing import Sequence

import numpy as np

from classifier.errors import TeacherError
from classifier.protocols import TeacherAnswer, TeacherRequest

_WORD = re.compile(r"\w+")


class HashEmbedder:
    """Hashes words (and word bigrams) into ``dim`` buckets; L2-normalised. No model."""

    def __init__(self, dim: int = 256, id: str = "fake:hash-256") -> None:
        self._dim = dim
        self._id = id
        self.calls = 0

    @property
    def id(self) -> str:
        return self._id

    @property
    def dim(self) -> int:
        return self._dim

    def encode(self, texts: Sequence[str], *, batch_size: int | None = None, progress: bool = False) -> np.ndarray:
        self.calls += 1
        out = np.zeros((len(texts), self._dim), dtype=np.float32)
        for i, t in enumerate(texts):
            words = _WORD.findall(t.lower())
            for tok in words + [a + "_" + b for a, b in zip(words, words[1:])]:
                h = int(hashlib.md5(tok.encode()).hexdigest()[:8], 16)
                out[i, h % self._dim] += 1.0 if (h >> 20) & 1 else -1.0
            n = np.linalg.norm(out[i])
            out[i] = out[i] / n if n > 0 else np.eye(1, self._dim, i % self._dim)
        return out


class ScriptedTeacher:
    """Answers from a function of the request, or raises a scripted TeacherError."""

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
        return TeacherAnswer(self.answer(request), self._model, self.delay_s * 1000)
