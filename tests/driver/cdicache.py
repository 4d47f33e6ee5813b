"""A model of the spec cache containerd 2 and CRI-O embed (container-device-interface
``pkg/cdi``), driven by real inotify events on a real directory.

Podman reads every spec file at every run, so a podman test cannot tell whether a runtime with a
*watching* cache would ever see our specs. This model applies that cache's rules, as its source
states them (``pkg/cdi/cache.go``, ``spec-dirs.go``; fsnotify's inotify backend):

* Watch: the spec directories, through fsnotify, which turns inotify masks into operations:
  ``IN_CREATE``/``IN_MOVED_TO`` → Create, ``IN_DELETE``/``IN_DELETE_SELF`` → Remove,
  ``IN_MODIFY`` → Write, ``IN_MOVED_FROM``/``IN_MOVE_SELF`` → Rename, ``IN_ATTRIB`` → Chmod.
* Refresh trigger: only Rename, Remove and Write (Create only on macOS, so not here); an event
  that is exactly Write (or exactly Create) counts only for a ``.json``/``.yaml`` name.
* Refresh: rescan every directory, non-recursively, reading only ``*.json``/``*.yaml`` files;
  a spec that fails to load or validate contributes nothing; a device name defined by two specs
  of the same priority is dropped as a conflict.
* Resolution (``InjectDevices``): the devices of the last refresh; it refreshes on its own only
  when a spec directory it could not watch before has appeared.

Validation of a loaded spec uses our implementation of the CDI parser's checks
(:func:`dra_driver.driver.cdi.check`), so a spec we would reject never counts as resolvable.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import inotify_simple
import yaml

from dra_driver.driver import cdi

WATCH_MASK = (
    inotify_simple.flags.CREATE
    | inotify_simple.flags.DELETE
    | inotify_simple.flags.DELETE_SELF
    | inotify_simple.flags.MODIFY
    | inotify_simple.flags.MOVED_FROM
    | inotify_simple.flags.MOVED_TO
    | inotify_simple.flags.MOVE_SELF
    | inotify_simple.flags.ATTRIB
)
SPEC_EXTENSIONS = (".json", ".yaml")


class Op(enum.Flag):
    """fsnotify's portable operations."""

    CREATE = enum.auto()
    WRITE = enum.auto()
    REMOVE = enum.auto()
    RENAME = enum.auto()
    CHMOD = enum.auto()


def op_of(mask: int) -> Op:
    """fsnotify's inotify backend: which operations one inotify mask stands for."""
    flags = inotify_simple.flags
    op = Op(0)
    if mask & (flags.CREATE | flags.MOVED_TO):
        op |= Op.CREATE
    if mask & (flags.DELETE | flags.DELETE_SELF):
        op |= Op.REMOVE
    if mask & flags.MODIFY:
        op |= Op.WRITE
    if mask & (flags.MOVED_FROM | flags.MOVE_SELF):
        op |= Op.RENAME
    if mask & flags.ATTRIB:
        op |= Op.CHMOD
    return op


def triggers_refresh(op: Op, name: str) -> bool:
    """The cache's watch loop: does this event make it rescan the directories?"""
    if not op & (Op.RENAME | Op.REMOVE | Op.WRITE):
        return False
    if op in (Op.WRITE, Op.CREATE):
        return os.path.splitext(name)[1] in SPEC_EXTENSIONS
    return True


@dataclasses.dataclass(frozen=True)
class Seen:
    """One event as the cache saw it."""

    name: str
    op: Op
    refreshed: bool


class SpecCache:
    """The watching CDI cache of one runtime over ``dirs`` (lowest priority first)."""

    def __init__(self, dirs: Iterable[Path]) -> None:
        self.dirs = [Path(d) for d in dirs]
        self.inotify = inotify_simple.INotify(nonblocking=True)
        self._watched: dict[int, Path] = {}
        self.devices: dict[str, dict[str, Any]] = {}
        self.errors: dict[str, list[str]] = {}
        self.refreshes = 0
        self.events: list[Seen] = []
        self._watch_missing()
        self.refresh()

    def close(self) -> None:
        self.inotify.close()

    def __enter__(self) -> SpecCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the watch loop ----------------------------------------------------------------------

    def pump(self, settle_ms: int = 200) -> list[Seen]:
        """Handle every event that arrives until none has come for ``settle_ms``."""
        handled: list[Seen] = []
        while True:
            batch = self.inotify.read(timeout=settle_ms)
            if not batch:
                return handled
            for event in batch:
                seen = self._handle(event.wd, event.mask, event.name)
                if seen is not None:
                    handled.append(seen)

    def _handle(self, wd: int, mask: int, name: str) -> Seen | None:
        if mask & inotify_simple.flags.IGNORED:  # the watch itself went away
            self._watched.pop(wd, None)
            return None
        op = op_of(mask)
        refresh = triggers_refresh(op, name)
        if refresh:
            self._watch_missing()
            self.refresh()
        seen = Seen(name=name, op=op, refreshed=refresh)
        self.events.append(seen)
        return seen

    # ---- refresh and resolution --------------------------------------------------------------

    def refresh(self) -> None:
        """Rescan all spec directories (``Cache.refresh``)."""
        self.refreshes += 1
        devices: dict[str, dict[str, Any]] = {}
        priorities: dict[str, int] = {}
        conflicts: set[str] = set()
        errors: dict[str, list[str]] = {}
        for priority, directory in enumerate(self.dirs):
            for path in _spec_files(directory):
                try:
                    spec = _load(path)
                except (OSError, ValueError) as exc:
                    errors.setdefault(str(path), []).append(f"failed to load CDI Spec {exc}")
                    continue
                problems = cdi.check(spec)
                if problems:
                    errors.setdefault(str(path), []).extend(problems)
                    continue
                for device in spec["devices"]:
                    qualified = f"{spec['kind']}={device['name']}"
                    if qualified in devices and priorities[qualified] == priority:
                        conflicts.add(qualified)
                        continue
                    devices[qualified] = {"spec": str(path), "device": device, "full": spec}
                    priorities[qualified] = priority
        for name in conflicts:
            devices.pop(name, None)
        self.devices, self.errors = devices, errors

    def unresolvable(self, device_ids: Iterable[str]) -> list[str]:
        """``InjectDevices``: the IDs the cache cannot resolve right now."""
        if self._watch_missing():  # a spec directory appeared: refreshIfRequired
            self.refresh()
        return [d for d in device_ids if d not in self.devices]

    def _watch_missing(self) -> bool:
        added = False
        watched = set(self._watched.values())
        for directory in self.dirs:
            if directory in watched:
                continue
            try:
                wd = self.inotify.add_watch(directory, WATCH_MASK)
            except OSError:
                continue  # not there (yet): retried at the next refresh or resolution
            self._watched[wd] = directory
            added = True
        return added


def _spec_files(directory: Path) -> list[Path]:
    try:
        entries = sorted(directory.iterdir())
    except FileNotFoundError:
        return []
    return [p for p in entries if p.is_file() and p.suffix in SPEC_EXTENSIONS]


def _load(path: Path) -> dict[str, Any]:
    text = path.read_text(encoding="utf-8")
    data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a CDI spec object")
    return data
