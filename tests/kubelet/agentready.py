"""Wait, inside a fixture's set-up, for an in-process node agent (``app.run`` on a thread) to log
its last start-up line, ``kubelet plugin ready``.

Why it exists: pytest captures output per phase and lets it through to the terminal between
phases; an agent thread still starting up when the set-up phase ends printed its start-up lines
among the progress dots. Waiting for the ready line keeps them inside the set-up's capture.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, MutableMapping
from typing import Any

import structlog

READY = "kubelet plugin ready"


def wait_ready(start: Callable[[], None], timeout_s: float = 60.0) -> None:
    """Run ``start`` (it starts the agent's thread) and return once the agent logged that it is
    ready; :class:`TimeoutError` if it does not within ``timeout_s``."""
    ready = threading.Event()

    def watch(
        _logger: object, _method: str, event_dict: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        if event_dict.get("event") == READY:
            ready.set()
        return event_dict

    processors = structlog.get_config()["processors"]  # the live list every logger reads
    processors.insert(0, watch)
    try:
        start()
        if not ready.wait(timeout_s):
            raise TimeoutError(f"the node agent did not log {READY!r} within {timeout_s}s")
    finally:
        if watch in processors:
            processors.remove(watch)
