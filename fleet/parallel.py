"""Object-store calls in parallel, with bounded memory: :func:`ordered_map`."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

__all__ = ["ordered_map"]

T = TypeVar("T")
R = TypeVar("R")


def ordered_map(fn: Callable[[T], R], items: Iterable[T], *, workers: int, name: str) -> Iterator[R]:
    """``fn(item)`` for every item on ``workers`` threads, yielded in the items' order, with
    at most ``2 * workers`` results held at once (downloads stay bounded however many
    objects there are). Leaving the loop early cancels what has not started."""
    if workers < 1:
        raise ValueError("workers must be >= 1")
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name) as pool:
        pending: deque[Future[R]] = deque()
        it = iter(items)
        try:
            while True:
                while len(pending) < 2 * workers:
                    try:
                        item = next(it)
                    except StopIteration:
                        break
                    pending.append(pool.submit(fn, item))
                if not pending:
                    return
                yield pending.popleft().result()
        finally:
            for f in pending:
                f.cancel()
