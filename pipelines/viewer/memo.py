"""A bounded cache of costly answers (a search's matches, a sort's order, a table's statistics),
each computed once even when many of the viewer's threads ask for it at the same moment: the
second asker waits for the first one's answer instead of reading the table a second time.
"""
from __future__ import annotations

import collections
import threading
from typing import Callable, Hashable, TypeVar

T = TypeVar("T")


class Memo:
    """At most `size` answers, the least recently used dropped first; one computation per key at a time."""

    def __init__(self, size: int):
        self.size = size
        self._done: collections.OrderedDict = collections.OrderedDict()
        self._pending: dict[Hashable, threading.Lock] = {}
        self._lock = threading.Lock()

    def _kept(self, key: Hashable):
        """(True, answer) if `key` is answered; the caller holds self._lock."""
        if key in self._done:
            self._done.move_to_end(key)
            return True, self._done[key]
        return False, None

    def get(self, key: Hashable, compute: Callable[[], T]) -> T:
        with self._lock:
            found, value = self._kept(key)
            if found:
                return value
            pending = self._pending.setdefault(key, threading.Lock())
        with pending:                           # whoever came first computes; the others wait here
            with self._lock:
                found, value = self._kept(key)
            if found:
                return value
            try:
                value = compute()
            except BaseException:               # a failure is not kept: the next asker tries again
                with self._lock:
                    self._forget(key, pending)
                raise
            with self._lock:                    # kept and no longer pending in one step
                self._done[key] = value
                while len(self._done) > self.size:
                    self._done.popitem(last=False)
                self._forget(key, pending)
            return value

    def _forget(self, key: Hashable, pending: threading.Lock) -> None:
        if self._pending.get(key) is pending:
            del self._pending[key]

    def __len__(self) -> int:
        return len(self._done)
