"""MPS for claims, loaded the first time something on this node needs it.

Why it exists: the MPS machinery (:mod:`~dra_driver.driver.mps.mpsclaims`, :mod:`~.mps` and the
daemon records, runners and steps below it, with pydantic for the records) serves only claims
that run through an MPS control daemon: shares of a shared GPU and devices whose merged config
says ``strategy: MPS``. Most nodes never see one, and one agent runs per GPU node, so what those
modules cost in memory is paid fleet-wide for nothing. :class:`LazyMpsClaims` stands where the
claim state, recovery and the periodic supervision expect an
:class:`~dra_driver.driver.mps.mpsclaims.MpsClaims` and builds the real one only when

* a claim's devices include a share or an MPS config (its plan),
* a claim record names an MPS daemon (its unprepare, start-up recovery, supervision), or
* anything of a daemon is on disk under ``<plugin dir>/mps`` (a record, a daemon's directories:
  recovery and supervision must see them; a time-slicing claim must not take a GPU a daemon
  serves). Lock files alone mean nothing: every stop leaves its lock behind.

Until then every call answers what the real one would with nothing to do (no needs, no
problems, nothing stopped), without importing it; once built it stays, and every call goes
through it. Daemons run as Pods (``--mps-daemon-image``) are built at once: their strays are
found through the API server, not on disk, so every recovery and supervision round asks.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dra_driver.driver import checkpoint, claims
from dra_driver.driver.mpspart import Item, uses_mps

if TYPE_CHECKING:
    from dra_driver.driver.mps import daemons as mps
    from dra_driver.driver.mps import mpsclaims


class LazyMpsClaims:
    """An :class:`~.mpsclaims.MpsClaims` built by ``build`` when first needed (module doc)."""

    def __init__(
        self,
        *,
        build: Callable[[], mpsclaims.MpsClaims],
        root: Path,
        store: checkpoint.Checkpoint,
        eager: bool = False,
    ) -> None:
        """``root``: the daemons' directory (``<plugin dir>/mps``); ``store``: the claim
        records; ``eager``: build now (daemons run as Pods)."""
        self.root = root
        self.store = store
        self._build = build
        self._guard = threading.Lock()
        self._claims: mpsclaims.MpsClaims | None = None
        if eager:
            self.real()

    @property
    def loaded(self) -> mpsclaims.MpsClaims | None:
        """The real one, if something needed it yet."""
        return self._claims

    def real(self) -> mpsclaims.MpsClaims:
        """The real one, built now if it was not."""
        with self._guard:
            if self._claims is None:
                self._claims = self._build()
            return self._claims

    @property
    def daemons(self) -> mps.MpsDaemons:
        return self.real().daemons

    def plan(
        self, ref: claims.ClaimRef, items: Sequence[Item]
    ) -> tuple[tuple[mpsclaims.Need, ...], dict[str, Any]]:
        if self._claims is None and not any(uses_mps(d.share_id, c) for d, _, c in items):
            return (), {}
        return self.real().plan(ref, items)

    def check_time_slicing(self, ref: claims.ClaimRef, uuids: Collection[str]) -> None:
        if not uuids or (self._claims is None and not self._on_disk()):
            return  # no daemon record: no GPU is served by a daemon
        self.real().check_time_slicing(ref, uuids)

    def acquire(
        self,
        ref: claims.ClaimRef,
        needs: Sequence[mpsclaims.Need],
        *,
        time_sliced: Collection[str],
    ) -> None:
        if needs:  # needs come from a plan, which built the real one
            self.real().acquire(ref, needs, time_sliced=time_sliced)

    def release(self, record: checkpoint.ClaimRecord) -> None:
        if any(d.mpsDaemon for d in record.devices):
            self.real().release(record)

    def check(self) -> None:
        if self._claims is None and not self._wanted(self.store.records()):
            return
        self.real().check()

    def recover(self, prepared: Sequence[checkpoint.ClaimRecord]) -> list[str]:
        if self._claims is None and not self._wanted(prepared):
            return []
        return self.real().recover(prepared)

    def _wanted(self, records: Sequence[checkpoint.ClaimRecord]) -> bool:
        return self._on_disk() or any(d.mpsDaemon for r in records for d in r.devices)

    def _on_disk(self) -> bool:
        """Whether anything of a daemon is under the root (what cannot be read counts)."""
        try:
            entries = list(self.root.iterdir())
        except FileNotFoundError:
            return False
        except OSError:
            return True
        for entry in entries:
            if entry.name == "locks":
                continue
            if entry.name != "daemons":
                return True
            try:
                if any(entry.iterdir()):
                    return True
            except FileNotFoundError:
                continue
            except OSError:
                return True
        return False
