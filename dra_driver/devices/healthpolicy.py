"""What a GPU health signal means: XID classes, taint effects, and how each condition can end.

Why it exists: the watcher (:mod:`dra_driver.devices.watcher`) only reports what NVML said; this
module decides what that means for scheduling, in one configurable place:

* XIDs that are application errors and leave the GPU usable are **ignored** by default, the same
  list NVIDIA's device plugin and DRA driver ignore: 13, 31, 43, 45, 68, 109. Operators add to it
  (``--health-ignore-xids``, ``all`` ignores every XID) or take XIDs out of it
  (``--health-enable-xids``).
* XIDs that need a node reboot (79, the GPU fell off the bus) and lost GPUs get the **fatal**
  effect (``NoExecute`` by default: running pods are evicted); everything else gets the normal
  effect (``NoSchedule``). Both effects are configurable.
* NVML's recovery-action field (``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``, recent drivers), when
  the driver reports one, overrides the tables: a reboot is fatal, a reset or drain is not, and
  the condition ends when the driver reports no action any more (a reset observed through NVML).
* How a condition ends (:class:`Finding`): a polled condition (pages pending retirement, row
  remapping, fabric, lost) ends when its check passes again; an XID or ECC error ends with an
  observed reset, an explicit recovered event, or — for **recoverable** XIDs only — after a quiet
  period without a repeat.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

from dra_driver import records
from dra_driver.devices import health

NO_SCHEDULE, NO_EXECUTE, NONE = "NoSchedule", "NoExecute", "None"
EFFECTS: Final = (NO_SCHEDULE, NO_EXECUTE, NONE)
_STRENGTH: Final[Mapping[str, int]] = {NONE: 0, NO_SCHEDULE: 1, NO_EXECUTE: 2}

# Application errors (NVIDIA's device plugin and DRA driver ignore exactly these by default).
DEFAULT_IGNORED_XIDS: Final = frozenset({13, 31, 43, 45, 68, 109})
DEFAULT_REBOOT_XIDS: Final = frozenset({79})
# Our choice: XIDs after which the GPU is usable again once they stop (docs/health.md).
DEFAULT_RECOVERABLE_XIDS: Final = frozenset({63, 92, 94})

# Short descriptions of well-known XIDs (NVIDIA's XID catalog), for messages and logs.
XID_NAMES: Final[Mapping[int, str]] = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup",
    48: "double-bit ECC error",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failed",
    68: "video processor exception",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    109: "context switch timeout",
    119: "GSP RPC timeout",
    120: "GSP error",
}
# NVML_GPU_RECOVERY_ACTION_* values (pinned against pynvml by a test) → our names.
RECOVERY_ACTIONS: Final[Mapping[int, str]] = {
    0: "none",
    1: "gpu-reset",
    2: "node-reboot",
    3: "drain-p2p",
    4: "drain-and-reset",
    5: "recover-imex-domain",
    6: "bus-reset",
    7: "system-reboot",
}
_REBOOT_ACTIONS: Final = frozenset({2, 7})

# Condition kinds: the taint key under the driver's domain is ``<domain>/<kind>``.
XID, ECC, LOST = "xid", "ecc", "gpu-lost"
PAGES, REMAP, FABRIC, ACTION = "retired-pages", "row-remap", "fabric", "recovery-action"


class PolicyError(ValueError):
    """A health setting is malformed (named in the message)."""


@records.record
class Finding:
    """One thing a detector saw, classified: the condition and how it can end.

    ``check`` set: the condition ends only when that polled check passes again. Otherwise it
    ends with an observed reset or an explicit recovered event, and also after the quiet period
    when ``quiet``.
    """

    condition: health.Condition
    check: str | None = None
    quiet: bool = False
    xid: int | None = None
    action: str = ""  # NVML's recovery action at the time, "" when not reported

    @property
    def kind(self) -> str:
        return self.condition.kind


@records.record
class HealthPolicy:
    """Every health setting (each one is a flag with an environment twin; docs/health.md)."""

    enabled: bool = True
    ignore_all_xids: bool = False
    ignored_xids: frozenset[int] = DEFAULT_IGNORED_XIDS
    enabled_xids: frozenset[int] = frozenset()  # never ignored, even with ignore_all_xids
    reboot_xids: frozenset[int] = DEFAULT_REBOOT_XIDS
    recoverable_xids: frozenset[int] = DEFAULT_RECOVERABLE_XIDS
    effect: str = NO_SCHEDULE
    fatal_effect: str = NO_EXECUTE
    quiet_period_s: float = 300.0
    min_hold_s: float = 60.0
    max_hold_s: float = 3600.0
    poll_interval_s: float = 10.0
    wait_ms: int = 1000

    def __post_init__(self) -> None:
        for name in ("effect", "fatal_effect"):
            value = getattr(self, name)
            if value not in EFFECTS:
                raise PolicyError(f"{name} {value!r}: not one of {', '.join(EFFECTS)}")
        for name in ("quiet_period_s", "min_hold_s", "max_hold_s", "poll_interval_s"):
            if getattr(self, name) < 0:
                raise PolicyError(f"{name} {getattr(self, name)}: must not be negative")
        if self.wait_ms <= 0:
            raise PolicyError(f"wait_ms {self.wait_ms}: must be positive")

    def hold_s(self, recoveries: int) -> float:
        """Minimum time unhealthy: doubles with each earlier recovery (never flap)."""
        return float(min(self.max_hold_s, self.min_hold_s * 2.0 ** min(recoveries, 32)))

    def ignores(self, xid: int) -> bool:
        return xid not in self.enabled_xids and (self.ignore_all_xids or xid in self.ignored_xids)

    # --- classification ------------------------------------------------------------------------
    def xid(self, xid: int, action: int | None = None) -> Finding | None:
        """An XID event; None when it is ignored (it changes nothing)."""
        if self.ignores(xid):
            return None
        name = XID_NAMES.get(xid, "critical error")
        fatal = xid in self.reboot_xids or action in _REBOOT_ACTIONS
        message = f"XID {xid} ({name})" + _action_text(action)
        return Finding(
            condition=self._condition(XID, str(xid), fatal, message),
            quiet=xid in self.recoverable_xids and not action,
            xid=xid,
            action=_action_name(action),
        )

    def ecc_dbe(self, action: int | None = None) -> Finding:
        return Finding(
            condition=self._condition(
                ECC,
                "double-bit",
                action in _REBOOT_ACTIONS,
                "double-bit ECC error (uncorrectable)" + _action_text(action),
            ),
            action=_action_name(action),
        )

    def lost(self, detail: str = "") -> Finding:
        message = "GPU is lost (NVML_ERROR_GPU_IS_LOST)" + (f": {detail}" if detail else "")
        return Finding(condition=self._condition(LOST, "lost", True, message), check=LOST)

    def recovery_action(self, action: int) -> Finding:
        """The driver asks for a recovery action although no event told us why."""
        name = _action_name(action)
        return Finding(
            condition=self._condition(
                ACTION, name, action in _REBOOT_ACTIONS, f"NVML recovery action: {name}"
            ),
            check=ACTION,
            action=name,
        )

    def pages_pending(self) -> Finding:
        message = "retired pages pending: the GPU needs a reset to retire them"
        return Finding(condition=self._condition(PAGES, "pending", False, message), check=PAGES)

    def remap(self, *, failure: bool) -> Finding:
        value = "failure" if failure else "pending"
        message = (
            "row remapping failed: the GPU needs service"
            if failure
            else "row remapping pending: the GPU needs a reset"
        )
        return Finding(condition=self._condition(REMAP, value, False, message), check=REMAP)

    def fabric(self, state: str) -> Finding:
        message = f"NVLink fabric {state}: multi-node NVLink is not usable"
        return Finding(condition=self._condition(FABRIC, "degraded", False, message), check=FABRIC)

    def _condition(self, kind: str, value: str, fatal: bool, message: str) -> health.Condition:
        effect = self.fatal_effect if fatal else self.effect
        return health.Condition(kind=kind, value=value, effect=effect, message=message)


def stronger(a: str, b: str) -> str:
    """The stronger of two taint effects."""
    return a if _STRENGTH.get(a, 0) >= _STRENGTH.get(b, 0) else b


def _action_name(action: int | None) -> str:
    if not action:
        return ""
    return RECOVERY_ACTIONS.get(action, f"action-{action}")


def _action_text(action: int | None) -> str:
    return f"; driver asks for {_action_name(action)}" if action else ""


def parse_xids(text: str | None, *, flag: str) -> tuple[frozenset[int], bool]:
    """``"48, 74"`` → ({48, 74}, False); ``"all"`` → (empty, True); bad entries are errors."""
    found: set[int] = set()
    every = False
    for part in (text or "").split(","):
        item = part.strip().lower()
        if not item:
            continue
        if item in ("all", "xids"):
            every = True
            continue
        try:
            value = int(item)
        except ValueError:
            raise PolicyError(f"{flag}: {part.strip()!r} is not an XID number") from None
        if value <= 0:
            raise PolicyError(f"{flag}: {value} is not an XID number")
        found.add(value)
    return frozenset(found), every


def ignored_xids(add: Iterable[int], remove: Iterable[int]) -> frozenset[int]:
    """The default ignore list, plus ``add``, minus ``remove`` (removal wins)."""
    return (DEFAULT_IGNORED_XIDS | frozenset(add)) - frozenset(remove)
