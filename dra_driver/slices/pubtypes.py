"""The plain types the ResourceSlice publisher shares with its callers.

Why its own module: :mod:`dra_driver.slices.publisher` is the controller; what it reports
(:class:`Outcome`, :class:`PublishError`), how it waits between retries (:class:`Backoff`,
shared with the ``publish`` command) and the logger it needs (:class:`Log`) are small values
tested on their own. The publisher re-exports them.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any, Protocol

from dra_driver.kube import api


class Log(Protocol):
    def info(self, event: str, **kw: Any) -> Any: ...
    def warning(self, event: str, **kw: Any) -> Any: ...
    def error(self, event: str, **kw: Any) -> Any: ...


class PublishError(Exception):
    """One API call of a reconcile failed; names the slice and the operation."""

    def __init__(self, op: str, slice_name: str, cause: api.ApiError) -> None:
        super().__init__(f"{op} ResourceSlice {slice_name!r} failed: {cause}")
        self.op, self.slice_name, self.cause = op, slice_name, cause


@dataclasses.dataclass(slots=True)
class Outcome:
    """What one reconcile pass did."""

    created: list[str] = dataclasses.field(default_factory=list)
    updated: list[str] = dataclasses.field(default_factory=list)
    deleted: list[str] = dataclasses.field(default_factory=list)
    rejected: list[str] = dataclasses.field(default_factory=list)  # failed local validation
    slices: int = 0  # slices of ours on the server after the pass
    generation: int = 0
    resource_version: str = ""

    @property
    def writes(self) -> int:
        return len(self.created) + len(self.updated) + len(self.deleted)


@dataclasses.dataclass(slots=True)
class Backoff:
    """Capped exponential backoff with "equal jitter": half fixed, half random."""

    initial_s: float = 0.5
    max_s: float = 60.0
    factor: float = 2.0
    rng: random.Random = dataclasses.field(default_factory=random.Random)
    step: int = 0

    def next_delay(self) -> float:
        base = min(self.max_s, self.initial_s * self.factor**self.step)
        self.step += 1
        return base / 2 + self.rng.uniform(0, base / 2)

    def reset(self) -> None:
        self.step = 0
