"""A thread-safe LRU cache of vectors in front of any embedder: :class:`CachedEmbedder`.

:func:`~classifier.encoders.factory.make_embedder` wraps every embedder it builds in one
(unless told not to); a query repeated word for word is then served without the encoder.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import cast

import numpy as np

from flywheel.classifier.encoders.base import check_texts
from flywheel.classifier.errors import EmbedderError
from flywheel.classifier.protocols import DelegatingEmbedder, Embedder

__all__ = ["CachedEmbedder", "uncached"]


class CachedEmbedder(DelegatingEmbedder):
    """Thread-safe LRU cache of vectors in front of another :class:`Embedder`.

    Keyed by the exact text. ``encode`` serves cached rows and sends only the misses
    (deduplicated) to the inner embedder, in one call.

    Parameters
    ----------
    inner : Embedder
        The embedder to cache.
    maxsize : int
        Most texts kept; 0 disables caching.

    Attributes
    ----------
    hits, misses : int
        Texts served from the cache (including repeats within one call) and texts
        sent to the inner embedder; ``hits + misses`` is the number of texts requested.
    """

    def __init__(self, inner: Embedder, maxsize: int = 20000) -> None:
        if maxsize < 0:
            raise EmbedderError(f"maxsize must be >= 0, got {maxsize!r}")
        super().__init__(inner)
        self.maxsize = int(maxsize)
        self.hits = 0
        self.misses = 0
        self._rows: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._rows)

    def cache_info(self) -> dict[str, int]:
        """``{"hits", "misses", "size", "maxsize"}``."""
        with self._lock:
            return {"hits": self.hits, "misses": self.misses, "size": len(self._rows), "maxsize": self.maxsize}

    def clear(self) -> None:
        """Drop every cached vector and reset the counters."""
        with self._lock:
            self._rows.clear()
            self.hits = self.misses = 0

    def lookup(self, text: str) -> np.ndarray | None:
        """The cached vector of ``text`` (counted as a hit), or ``None`` (not counted: the
        caller will ``encode`` it, which counts the miss). Never encodes."""
        with self._lock:
            row = self._rows.get(text)
            if row is None:
                return None
            self._rows.move_to_end(text)
            self.hits += 1
            return row

    def encode(self, texts: Sequence[str], *, batch_size: int | None = None,
               progress: bool = False) -> np.ndarray:
        """Like :meth:`Embedder.encode`, serving repeated texts from the cache."""
        items = check_texts(texts)
        n = len(items)
        if n == 0:
            return self.inner.encode([], batch_size=batch_size, progress=progress)
        rows: list[np.ndarray | None] = [None] * n
        missing: dict[str, list[int]] = {}
        with self._lock:
            get, touch = self._rows.get, self._rows.move_to_end
            for i, t in enumerate(items):
                row = get(t)
                if row is not None:
                    touch(t)
                    rows[i] = row
                else:
                    missing.setdefault(t, []).append(i)
            self.misses += len(missing)
            self.hits += n - len(missing)
        if n == 1 and rows[0] is not None:  # the hot path: one repeated query
            return rows[0][None, :].copy()
        if missing:
            fresh = self.inner.encode(list(missing), batch_size=batch_size, progress=progress)
            with self._lock:
                for (t, idx), vec in zip(missing.items(), fresh, strict=True):
                    vec = vec.copy()
                    vec.setflags(write=False)
                    for i in idx:
                        rows[i] = vec
                    if self.maxsize:
                        self._rows[t] = vec
                        self._rows.move_to_end(t)
                while len(self._rows) > self.maxsize:
                    self._rows.popitem(last=False)
        # every row is set by now: a hit above, or a miss just encoded (zip(strict=True))
        return np.stack(cast("list[np.ndarray]", rows)).astype(np.float32, copy=False)

    def __repr__(self) -> str:
        return f"CachedEmbedder({self.inner!r}, size={len(self._rows)}/{self.maxsize})"


def uncached(embedder: Embedder) -> Embedder:
    """The embedder behind any :class:`CachedEmbedder` layers (to time or evaluate the
    encoder itself, not its cache)."""
    while isinstance(embedder, CachedEmbedder):
        embedder = embedder.inner
    return embedder
