"""How an MPS control daemon runs: the interface between the daemons' life cycle and its runners.

Why it exists: :class:`~.daemons.MpsDaemons` owns *when* a daemon runs — records,
locks, compute mode, directories, adoption, supervision, crash recovery — and is the same
whatever runs the daemon. A :class:`DaemonRunner` owns *how*:

* :class:`~dra_driver.driver.mps.mpsprocess.ProcessRunner`: a child process of the agent in its own
  session (outside a cluster: ``demo``, tests, ``--fake`` without an API server; it stops with
  the agent's container);
* :class:`~dra_driver.driver.mps.mpspod.PodRunner`: a Pod of its own on this node, created through
  the API server, which outlives agent upgrades and restarts (the chart's default).

A runner never touches compute modes or records: it names what it will run before it runs
(:meth:`DaemonRunner.intent`, recorded before the start), starts it, waits until it answers on
its control socket, says whether it still runs, and ends it — whether the record names it
exactly or a crash left it unrecorded.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, Protocol

from dra_driver import records
from dra_driver.driver.mps.mpsrecords import DaemonDevice, DaemonRecord, Dirs

Reason = Literal["exited", "deleted"]


@records.record
class Launch:
    """One daemon to start: its id, the devices it serves and its directories."""

    daemon_id: str
    devices: tuple[DaemonDevice, ...]
    dirs: Dirs


@records.record
class Liveness:
    """Whether a recorded daemon runs: ``alive`` None when the runner cannot tell right now
    (the API server is unreachable); ``reason`` why it does not (``exited``, ``deleted``) and
    ``detail`` for the log."""

    alive: bool | None
    reason: Reason | None = None
    detail: str = ""


@records.record
class Stray:
    """A daemon that runs although no record names it (found by its runner)."""

    daemon_id: str
    name: str  # what the runner calls it (a Pod's name)
    uid: str
    devices: tuple[DaemonDevice, ...]


class DaemonRunner(Protocol):
    """Starts, watches and ends MPS control daemons; every error is an ``MpsError`` whose
    message names the daemon's process or Pod and the reason."""

    @property
    def kind(self) -> Literal["process", "pod"]:
        """Log field and metric label."""
        ...

    def intent(self, record: DaemonRecord) -> DaemonRecord:
        """The ``Starting`` record, naming what will run (written before :meth:`start`)."""
        ...

    def start(self, launch: Launch, record: DaemonRecord) -> DaemonRecord:
        """Start the daemon; the ``Running`` record naming what runs now."""
        ...

    def wait_ready(self, launch: Launch, record: DaemonRecord) -> None:
        """Return once the daemon answers on its control socket; ``MpsError`` when it does not
        within the runner's ready timeout or ends first."""
        ...

    def liveness(self, record: DaemonRecord) -> Liveness: ...

    def stop(self, record: DaemonRecord, dirs: Dirs) -> None:
        """End whatever runs for ``record`` (recorded or not) and return once it is gone;
        ``MpsError`` when that cannot be confirmed (the compute mode must then stay)."""
        ...

    def strays(self, records: Mapping[str, DaemonRecord]) -> list[Stray]:
        """Daemons of this node that run although ``records`` name none of them."""
        ...

    def end_stray(self, stray: Stray) -> None:
        """End ``stray`` and return once it is gone (``MpsError`` otherwise)."""
        ...

    def describe(self, record: DaemonRecord) -> dict[str, object]:
        """Log fields naming what runs the daemon (pid, or pod and its UID)."""
        ...
