"""``OnceCache``: a thread-safe ``key -> value`` store that computes each value at most once at a time (the
profiles' lazily traced activations and counts, and the process-wide trace caches of ``advisor.profile``)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import Generic, TypeVar

V = TypeVar("V")


class OnceCache(Generic[V]):
    """``key -> value`` computed at most once at a time per key, thread-safe.

    ``get(key, compute)`` returns the stored value; otherwise the first caller runs ``compute()`` (outside
    the lock) while concurrent callers of the same key wait for it and receive the same object (or the
    same exception; failures are not stored, so a later call tries again). ``maxsize``: keep that many
    values, least recently used dropped first (None: all).
    """

    def __init__(self, maxsize: int | None = None) -> None:
        self._lock = threading.Lock()
        self._done: OrderedDict[Hashable, V] = OrderedDict()
        self._running: dict[Hashable, Future[V]] = {}
        self._maxsize = maxsize

    def get(self, key: Hashable, compute: Callable[[], V]) -> V:
        with self._lock:
            if key in self._done:
                self._done.move_to_end(key)
                return self._done[key]
            running = self._running.get(key)
            if running is None:
                future: Future[V] = Future()
                self._running[key] = future
        if running is not None:
            return running.result()
        try:
            value = compute()
        except BaseException as err:
            with self._lock:
                del self._running[key]
            future.set_exception(err)
            raise
        with self._lock:
            self._done[key] = value
            del self._running[key]
            while self._maxsize is not None and len(self._done) > self._maxsize:
                self._done.popitem(last=False)
        future.set_result(value)
        return value

    def clear(self) -> None:
        """Drop the stored values (computations in progress still finish and store theirs)."""
        with self._lock:
            self._done.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._done)
