"""A Kubernetes Event on a prepared claim whose device vanished under it.

Why it exists: a GPU that falls off the bus, a card replaced across a reboot, or a MIG device an
admin destroyed behind the driver's back leaves a claim prepared on a device that is no longer
there. The claim is reported, never re-prepared elsewhere (docs/lifecycle.md); beside the log
line and the claim's ``Ready=False`` condition, the report an operator sees first is an Event:
``kubectl get events`` in the claim's namespace, ``kubectl describe resourceclaim``. This module
builds that ``events.k8s.io/v1`` Event (``Warning``, reason ``GpuVanished``, regarding the claim
with its uid, a note naming the devices and their UUIDs, reported by the driver from its node)
and writes it through the port's ``create_event``.

Its name is derived from the claim's uid and what was lost, so the same loss is never reported
twice, not even by an agent restarted in between: the second create answers 409 AlreadyExists,
taken as done. A failure to write it is logged with the claim and goes no further: the Event is
a courtesy beside the condition and the log line, and must never stop the rest of the report.
"""

from __future__ import annotations

import datetime
import hashlib
import threading
from collections.abc import Iterable, Sequence

import structlog

from dra_driver import logs, records
from dra_driver.driver import claims, claimstatus
from dra_driver.kube import api as kube

REASON = claimstatus.VANISHED_REASON
ACTION_RUNTIME = "Rediscover"  # the agent rediscovered the node while it ran
ACTION_START = "Recover"  # the agent found it recovering its checkpoint at start
NOTE_LIMIT = 1024  # the server refuses a longer note


@records.record
class Loss:
    """One device of a claim that is gone: its name, the UUID(s) it used, and whether it was
    a MIG device destroyed (its parent GPU still there) rather than a GPU that vanished."""

    device: str
    uuids: tuple[str, ...] = ()
    mig: bool = False

    def describe(self) -> str:
        which = ", ".join(self.uuids) or "its UUID unknown"
        if self.mig:
            return f"MIG device {self.device} ({which}) was destroyed behind the driver's back"
        return f"device {self.device} lost its GPU ({which}): it vanished from the node"


def note(losses: Sequence[Loss], node_name: str) -> str:
    """What the Event says, within the server's 1 kB."""
    text = (
        f"On node {node_name}: "
        + "; ".join(loss.describe() for loss in losses)
        + ". The claim is not re-prepared on another device; delete its pods to get a new one."
    )
    return text if len(text) <= NOTE_LIMIT else text[: NOTE_LIMIT - 3] + "..."


def event_name(ref: claims.ClaimRef, losses: Iterable[Loss]) -> str:
    """``<claim>.<digest of uid and losses>``: the same for the same loss, a DNS subdomain."""
    key = "|".join([ref.uid, REASON, *sorted(f"{x.device}={','.join(x.uuids)}" for x in losses)])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return f"{ref.name[:200].rstrip('.-')}.{digest}"


def vanished_event(
    ref: claims.ClaimRef,
    losses: Sequence[Loss],
    *,
    driver_name: str,
    node_name: str,
    action: str,
    now: datetime.datetime | None = None,
) -> kube.Obj:
    """The ``events.k8s.io/v1`` Event reporting ``losses`` of the claim ``ref``."""
    when = (now or datetime.datetime.now(datetime.UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": event_name(ref, losses), "namespace": ref.namespace},
        "eventTime": when,
        "type": "Warning",
        "reason": REASON,
        "action": action,
        "reportingController": driver_name,
        "reportingInstance": node_name,
        "regarding": {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "namespace": ref.namespace,
            "name": ref.name,
            "uid": ref.uid,
        },
        "note": note(losses, node_name),
    }


def emit(
    api: kube.KubeApi,
    ref: claims.ClaimRef,
    losses: Sequence[Loss],
    *,
    driver_name: str,
    node_name: str,
    action: str,
    log: structlog.typing.FilteringBoundLogger,
) -> bool:
    """Write the Event; True when it is on the server (written now, or before: 409)."""
    clog = logs.claim_logger(log, uid=ref.uid, namespace=ref.namespace, name=ref.name)
    event = vanished_event(ref, losses, driver_name=driver_name, node_name=node_name, action=action)
    try:
        api.create_event(ref.namespace, event)
    except kube.Conflict as exc:
        if exc.reason == "AlreadyExists":
            clog.debug(
                "the claim's vanished device was reported before",
                event_name=event_name(ref, losses),
            )
            return True
        clog.warning("cannot write the Event about the claim's vanished device", error=str(exc))
        return False
    except Exception as exc:  # an Event is best effort: nothing else may fail for it
        clog.warning("cannot write the Event about the claim's vanished device", error=str(exc))
        return False
    return True


def emit_soon(
    api: kube.KubeApi,
    reports: Sequence[tuple[claims.ClaimRef, Sequence[Loss]]],
    *,
    driver_name: str,
    node_name: str,
    action: str,
    log: structlog.typing.FilteringBoundLogger,
) -> threading.Thread | None:
    """:func:`emit` each report in a thread of its own (the caller, the driver watch, must not
    wait on the API server); returns it started, None when there is nothing to write."""
    if not reports:
        return None

    def run() -> None:
        for ref, losses in reports:
            emit(
                api,
                ref,
                losses,
                driver_name=driver_name,
                node_name=node_name,
                action=action,
                log=log,
            )

    thread = threading.Thread(target=run, name="claim-events", daemon=True)
    thread.start()
    return thread
