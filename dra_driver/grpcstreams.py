"""Room for long-lived gRPC streams that never comes out of the workers serving unary calls.

Why it exists: grpc's synchronous server runs every call, a server-streaming one included, on a
thread of its pool for as long as the call lasts. A DRA health stream (``NodeWatchResources``)
or a device-plugin ``ListAndWatch`` lives as long as the kubelet's connection, so a handful of
them (a kubelet that reconnects in a loop, or anyone with access to the socket) would hold every
worker, and NodePrepareResources / Allocate would queue until the kubelet's deadline.

A server that serves streams therefore gets ``unary workers + STREAM_SLOTS`` threads, and each
stream first takes one of :data:`STREAM_SLOTS` slots: at most that many streams run at once, so
the unary workers are always free for unary calls. A stream that finds no free slot is refused
at once with ``RESOURCE_EXHAUSTED`` (the kubelet retries; a stream whose client went away frees
its slot within its poll interval).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import grpc

STREAM_SLOTS = 4


class StreamSlots:
    """A fixed number of slots for concurrent streams of one server (thread-safe)."""

    def __init__(self, *, what: str, limit: int = STREAM_SLOTS) -> None:
        if limit < 1:
            raise ValueError(f"{what}: at least one stream slot is needed, got {limit}")
        self.what = what
        self.limit = limit
        self._free = threading.BoundedSemaphore(limit)
        self._guard = threading.Lock()
        self._open = 0

    @property
    def open(self) -> int:
        """Streams holding a slot now."""
        with self._guard:
            return self._open

    @contextlib.contextmanager
    def slot(self, context: grpc.ServicerContext) -> Iterator[None]:
        """Hold a slot for the stream's lifetime; abort the call when none is free."""
        if not self._free.acquire(blocking=False):
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{self.what}: {self.limit} streams are open already; try again later",
            )
        with self._guard:
            self._open += 1
        try:
            yield
        finally:
            with self._guard:
                self._open -= 1
            self._free.release()
