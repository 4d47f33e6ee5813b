"""Waiting for a condition by polling: the one loop the test kit, the demo and the tests share.

Why it exists: processes, watches and kubelet stand-ins change state in other threads and
processes, so tests and demo scenes wait for what they expect instead of sleeping a guessed
time. Two shapes: :func:`poll` answers whether the condition came true in time (for an
``assert``); :func:`wait_for` returns the condition's first truthy value or raises
:class:`TimeoutError` naming what was awaited.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def poll(condition: Callable[[], Any], timeout_s: float = 20.0, interval_s: float = 0.05) -> bool:
    """Whether ``condition()`` became truthy within ``timeout_s`` (checked once more at the end)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval_s)
    return bool(condition())


def wait_for(
    check: Callable[[], Any], *, what: str, timeout_s: float = 30.0, interval_s: float = 0.05
) -> Any:
    """``check()``'s first truthy value, polled; :class:`TimeoutError` naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s}s")
        time.sleep(interval_s)
