"""The watch half of the ResourceSlice publisher: notice what someone else did to our slices.

Why it exists: the publisher (:mod:`.publisher`) writes nothing when nothing changed, so it must
hear when another client updates or deletes one of this node's slices to put it back. This is
that watch, a base class of :class:`~.publisher.Publisher` run in its own thread: each event
that is not the echo of our own write wakes the reconcile loop. The watch re-lists when the
server says its resourceVersion is too old (HTTP 410, as the status of the request or in an
ERROR event), and is re-opened at once where it was when its connection died (the API client
ends a watch that stays silent past the time the server promised to end it); a server that ends
watches at once is retried with backoff. It holds no state of its own: the attributes below are
the publisher's, declared here for the type checker.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dra_driver.kube import api
from dra_driver.slices.pubtypes import Backoff, Log


class SliceWatch:
    """Watches this driver's slices on this node for the publisher deriving from it."""

    _api: api.KubeApi
    driver_name: str
    node_name: str
    log: Log
    synced: threading.Event
    _lock: threading.Lock
    _wake: threading.Event
    _stop: threading.Event
    _desired: list[api.Obj] | None
    _known: dict[str, str]
    _watch_from: str | None
    _watch_timeout_s: float
    _outage: bool
    _on_watch: Callable[[bool], None] | None
    _watch_backoff: Backoff

    if TYPE_CHECKING:

        def _tell(self, observer: Callable[[Any], None] | None, news: object) -> None: ...

        def _reconnected(self) -> None: ...

    def _watch_loop(self) -> None:
        """Wake the reconcile loop when someone else changes or deletes one of our slices."""
        failures = self._watch_backoff
        while not self._stop.is_set():
            start = self._watch_from
            if start is None:
                self._stop.wait(0.05)
                continue
            began = time.monotonic()
            opened = False
            try:
                events = self._api.watch_resource_slices(
                    driver=self.driver_name,
                    node_name=self.node_name,
                    resource_version=start,
                    timeout_s=self._watch_timeout_s,
                )
                opened = True
                self._tell(self._on_watch, True)
                self._reconnected()
                try:
                    for event in events:
                        if self._stop.is_set():
                            return
                        if not self._handle(event):
                            break
                finally:  # a generator left open could hold what the API holds for it
                    close = getattr(events, "close", None)
                    if close is not None:
                        close()
                lasted = time.monotonic() - began
                if lasted < 0.9 * self._watch_timeout_s and not self._stop.is_set():
                    self._outage = True  # ended by the server early (a restart?)
                if lasted < min(1.0, self._watch_timeout_s / 2):
                    self._stop.wait(failures.next_delay())  # a server ending watches at once
                else:
                    failures.reset()
            except api.ApiError as exc:
                if self._stop.is_set():
                    return
                expired = exc.status == 410 or exc.reason in ("Expired", "Gone")
                if expired:  # our resourceVersion is gone: only a fresh list can go on
                    self._relist()
                else:  # refused, or broke off: not watching (readiness counts from now)
                    self._tell(self._on_watch, False)
                    self._outage = True
                if opened and time.monotonic() - began >= min(1.0, self._watch_timeout_s / 2):
                    failures.reset()  # a watch that ran a while and broke: re-open it at once
                self.log.warning(
                    "watch of ResourceSlices failed",
                    error=str(exc),
                    status=exc.status,
                    relist=expired,
                )
                self._stop.wait(failures.next_delay())

    def _relist(self) -> None:
        """Forget the watch position; the next reconcile lists afresh and the watch resumes
        from that list's resourceVersion."""
        self._watch_from = None
        self.synced.clear()
        self._wake.set()

    def _handle(self, event: api.WatchEvent) -> bool:
        """Process one event; False = restart the watch from a fresh list."""
        meta = event.object.get("metadata") or {}
        if event.type == "ERROR":  # 410 Expired/Gone, or anything else: start from a list
            self.log.info(
                "watch of ResourceSlices ended with an error; re-listing",
                code=event.object.get("code"),
                reason=event.object.get("reason"),
            )
            self._relist()
            return False
        rv = str(meta.get("resourceVersion") or "")
        if rv:
            self._watch_from = rv
        name = str(meta.get("name") or "")
        if event.type == "BOOKMARK":
            return True
        with self._lock:
            wanted = {s["metadata"]["name"] for s in self._desired or ()}
        if event.type == "DELETED":
            ours = name not in wanted and name not in self._known
        else:
            ours = self._known.get(name) == rv
        if not ours:
            self.synced.clear()
            self._wake.set()
        return True
