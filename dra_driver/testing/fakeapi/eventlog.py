"""The watch history of the in-memory API: events by resourceVersion, blocking readers.

Why it exists: a watch from a given resourceVersion must deliver every later change exactly
once, wait for new ones without spinning, end at its timeout, answer "410 Expired" once the
history it needs has been compacted away, and be closable from outside (a server restart).
That is a small concurrency component of its own, kept apart from the object store.
"""

from __future__ import annotations

import collections
import copy
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Literal, cast

from dra_driver.kube import api

EventType = Literal["ADDED", "MODIFIED", "DELETED"]


class EventLog:
    """Bounded history of (resourceVersion, type, object); shares the store's condition."""

    def __init__(self, condition: threading.Condition, *, history: int = 10_000) -> None:
        self._cond = condition
        self._events: collections.deque[tuple[int, str, api.Obj]] = collections.deque(
            maxlen=history
        )
        self._compacted = 0  # events up to this resourceVersion are no longer kept
        self._epoch = 0
        self._closed = False

    def append(self, kind: EventType, obj: api.Obj) -> None:
        """Record an event (caller holds the condition's lock) and wake the readers."""
        if len(self._events) == self._events.maxlen:
            self._compacted = self._events[0][0]
        self._events.append((int(obj["metadata"]["resourceVersion"]), kind, copy.deepcopy(obj)))
        self._cond.notify_all()

    def end_watches(self) -> None:
        """End every open watch (caller holds the lock)."""
        self._epoch += 1
        self._cond.notify_all()

    def close(self) -> None:
        self._closed = True
        self._cond.notify_all()

    def watch(
        self,
        *,
        position: int,
        initial: list[api.Obj],
        deadline: float,
        selected: Callable[[api.Obj], bool],
    ) -> Iterator[api.WatchEvent]:
        """Synthetic ADDED events for ``initial``, then every matching event after
        ``position`` until ``deadline`` (monotonic), a close or :meth:`end_watches`."""
        with self._cond:
            epoch = self._epoch
        return self._follow(position, initial, deadline, selected, epoch)

    def _follow(
        self,
        position: int,
        initial: list[api.Obj],
        deadline: float,
        selected: Callable[[api.Obj], bool],
        epoch: int,
    ) -> Iterator[api.WatchEvent]:
        for obj in initial:
            yield api.WatchEvent("ADDED", obj)
        while True:
            with self._cond:
                compacted = self._compacted
                if position < compacted:  # yielded below: never while holding the lock
                    break
                batch = [
                    (rv, kind, copy.deepcopy(obj))
                    for rv, kind, obj in self._events
                    if rv > position
                ]
                if not batch:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or self._closed or self._epoch != epoch:
                        return
                    self._cond.wait(remaining)
                    continue
            for rv, kind, obj in batch:
                position = rv
                if selected(obj):
                    yield api.WatchEvent(cast(EventType, kind), obj)
        yield api.WatchEvent("ERROR", expired(position, compacted))


def expired(position: int, compacted: int) -> dict[str, Any]:
    """The Status a server sends in an ERROR event when the requested history is gone."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "code": 410,
        "reason": "Expired",
        "message": f"too old resource version: {position} ({compacted})",
    }
