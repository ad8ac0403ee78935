"""The readers-writer lock of :class:`~streammem_kernels.CosineIndex`: any number of searches at once, a
writer alone."""
from __future__ import annotations

import threading

__all__ = ["SharedLock", "writer"]


class SharedLock:
    """Searches share it; a writer holds it alone (it waits for running searches, and searches that
    start while a writer waits wait for it)."""

    __slots__ = ("_cond", "_readers", "_writing")

    def __init__(self):
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writing = 0  # writers holding or waiting

    def acquire_read(self) -> None:
        with self._cond:
            while self._writing:
                self._cond.wait()
            self._readers += 1

    def release_read(self) -> None:
        with self._cond:
            self._readers -= 1
            if not self._readers:
                self._cond.notify_all()

    def acquire_write(self) -> None:
        with self._cond:
            self._writing += 1
            while self._readers:
                self._cond.wait()

    def release_write(self) -> None:
        with self._cond:
            self._writing -= 1
            self._cond.notify_all()


def writer(method):
    """Run a mutating method holding the object's lock (``self._lock``) alone (methods it calls do not take it again)."""
    def locked(self, *args, **kwargs):
        lock = self._lock
        lock.acquire_write()
        try:
            return method(self, *args, **kwargs)
        finally:
            lock.release_write()

    locked.__name__, locked.__doc__, locked.__wrapped__ = method.__name__, method.__doc__, method
    return locked
