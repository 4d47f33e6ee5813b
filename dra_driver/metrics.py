"""Prometheus metrics of the node agent, in one registry the composition root hands around.

Why it exists: an operator must see from outside whether prepares succeed and how long they take
(the kubelet gives up after 45 s), how many claims and devices a node holds, whether slice
publishing keeps failing and whether NVML is erroring. All metrics live in an explicit
``CollectorRegistry`` (never prometheus-client's global one), so two agents in one test process
do not collide and tests read exact values.

Label values are closed sets (operation, result) to keep the series count bounded; per-claim
detail belongs in the logs, not in labels. Because the sets are closed, every labelled series is
created once at start-up and kept in a dict: a request does no prometheus ``labels()`` lookup
(which costs a lock and a few tuple/dict operations per call) on the per-claim hot path.

Names (prefix ``dra_driver_``):

========================================== ========= =========================================
name                                       type      labels
========================================== ========= =========================================
requests_total                             counter   operation (prepare|unprepare), result
request_duration_seconds                   histogram operation
requests_in_flight                         gauge     operation
prepared_claims / prepared_devices         gauge
resourceslice_publish_total                counter   result (success|error)
resourceslices                             gauge     (slices in the last published state)
resourceslice_rebuilds_total               counter   cause (health|claims)
held_gpus                                  gauge     (full GPUs prepared claims hold)
gpus                                       gauge     state (free|held|unhealthy): full GPUs
placeable_sets                             gauge     size (1..GPUs): disjoint free N-GPU sets
best_set_links                             gauge     size: NVLink links of the best free N-set
best_set_links_max                         gauge     size: the same on the empty node
nvml_errors_total                          counter   call (e.g. init, discover, health)
device_health                              gauge     device, reason (1 healthy, 0 unhealthy)
health_events_total                        counter   kind (xid|ecc|gpu-lost|...), xid, outcome
device_recoveries_total                    counter   device (a GPU or MIG UUID's name)
mps_daemon_restarts_total                  counter   runner (process|pod), reason (exited|
                                                     deleted|gone-at-start|missing)
mps_lost_clients_total                     counter   runner (claims whose daemon was restarted)
feature_enabled                            gauge     feature (deviceTaints|sharedCounters|
                                                     consumableCapacity|setRanks)
build_info                                 gauge     version (always 1)
========================================== ========= =========================================

What the values of ``device_health``, the set-capacity gauges, ``feature_enabled`` and the MPS
counters mean: docs/metrics.md.

One *request* is one claim's prepare or unprepare (the kubelet batches claims in one RPC; the
per-claim outcome is what an operator needs).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Literal

import prometheus_client as prom
import structlog

from dra_driver import __version__, setmetrics

if TYPE_CHECKING:
    from dra_driver.devices import setcapacity

Operation = Literal["prepare", "unprepare"]
Result = Literal["success", "error"]

OPERATIONS: tuple[Operation, ...] = ("prepare", "unprepare")
RESULTS: tuple[Result, ...] = ("success", "error")
NAMESPACE = "dra_driver"
FEATURES = ("deviceTaints", "sharedCounters", "consumableCapacity", "setRanks")

# Resolve sub-millisecond prepares (fake GPUs, repeated prepare) up to the kubelet's 45 s limit.
DURATION_BUCKETS: tuple[float, ...] = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    45.0,
)


class MetricsError(Exception):
    """A metric was fed a value outside its closed label set or range."""


class RequestTimer:
    """Handle inside :meth:`DriverMetrics.request`: record the devices, or :meth:`fail`."""

    __slots__ = ("devices", "error", "result")

    def __init__(self) -> None:
        self.result: Result = "success"
        self.error = ""
        self.devices: Sequence[str] = ()

    def fail(self, error: str = "") -> None:
        """Count this request as ``result="error"`` although no exception escaped."""
        self.result = "error"
        self.error = error or self.error


class DriverMetrics:
    """Every metric of the agent, registered in ``registry``."""

    def __init__(self, *, registry: prom.CollectorRegistry, namespace: str = NAMESPACE) -> None:
        self.registry = registry
        self.requests = prom.Counter(
            "requests",
            "Claim prepare/unprepare requests by outcome.",
            ["operation", "result"],
            namespace=namespace,
            registry=registry,
        )
        self.duration = prom.Histogram(
            "request_duration_seconds",
            "Time to prepare or unprepare one claim.",
            ["operation"],
            namespace=namespace,
            registry=registry,
            buckets=DURATION_BUCKETS,
        )
        self.in_flight = prom.Gauge(
            "requests_in_flight",
            "Claim prepare/unprepare requests being handled now.",
            ["operation"],
            namespace=namespace,
            registry=registry,
        )
        self.prepared_claims = prom.Gauge(
            "prepared_claims",
            "Claims currently prepared on this node.",
            namespace=namespace,
            registry=registry,
        )
        self.prepared_devices = prom.Gauge(
            "prepared_devices",
            "Devices currently prepared for claims on this node.",
            namespace=namespace,
            registry=registry,
        )
        self.slice_publishes = prom.Counter(
            "resourceslice_publish",
            "ResourceSlice reconcile passes by outcome.",
            ["result"],
            namespace=namespace,
            registry=registry,
        )
        self.slices = prom.Gauge(
            "resourceslices",
            "ResourceSlices in the last successfully published state.",
            namespace=namespace,
            registry=registry,
        )
        self.slice_rebuilds = prom.Counter(
            "resourceslice_rebuilds",
            "Desired ResourceSlices rebuilt because GPU health or the GPUs held by claims changed.",
            ["cause"],
            namespace=namespace,
            registry=registry,
        )
        self.held_gpus = prom.Gauge(
            "held_gpus",
            "Full GPUs held by claims prepared on this node, as the last rebuild saw them.",
            namespace=namespace,
            registry=registry,
        )
        self.nvml_errors = prom.Counter(
            "nvml_errors",
            "NVML calls that failed, by call.",
            ["call"],
            namespace=namespace,
            registry=registry,
        )
        self.device_health = prom.Gauge(
            "device_health",
            "1 while the device is healthy, 0 while not; reason names its conditions.",
            ["device", "reason"],
            namespace=namespace,
            registry=registry,
        )
        self.health_events = prom.Counter(
            "health_events",
            "GPU health events (NVML) by kind, XID and what they caused.",
            ["kind", "xid", "outcome"],
            namespace=namespace,
            registry=registry,
        )
        self.device_recoveries = prom.Counter(
            "device_recoveries",
            "Times a device became healthy again after being unhealthy.",
            ["device"],
            namespace=namespace,
            registry=registry,
        )
        self.feature_enabled = prom.Gauge(
            "feature_enabled",
            "1 while the API server keeps the ResourceSlice fields of the feature, 0 while it "
            "drops them (feature gate off); setRanks: 1 while set ranks are published.",
            ["feature"],
            namespace=namespace,
            registry=registry,
        )
        self.mps_daemon_restarts = prom.Counter(
            "mps_daemon_restarts",
            "MPS control daemons restarted while claims used them, by runner and reason.",
            ["runner", "reason"],
            namespace=namespace,
            registry=registry,
        )
        self.mps_lost_clients = prom.Counter(
            "mps_lost_clients",
            "Prepared claims whose MPS control daemon died (their CUDA clients were cut off).",
            ["runner"],
            namespace=namespace,
            registry=registry,
        )
        self.capacity = setmetrics.SetCapacityGauges(registry=registry, namespace=namespace)
        self._health_lock = threading.Lock()
        self._health_reason: dict[str, str] = {}
        build = prom.Gauge(
            "build_info",
            "Always 1; the label carries the driver version.",
            ["version"],
            namespace=namespace,
            registry=registry,
        )
        build.labels(version=__version__).set(1)
        # Every closed-set series, created now (dashboards see zeros, not gaps) and cached so
        # the per-request path never calls labels().
        self._in_flight = {op: self.in_flight.labels(operation=op) for op in OPERATIONS}
        self._duration = {op: self.duration.labels(operation=op) for op in OPERATIONS}
        self._requests = {
            (op, result): self.requests.labels(operation=op, result=result)
            for op in OPERATIONS
            for result in RESULTS
        }
        self._slice_publishes = {
            ok: self.slice_publishes.labels(result="success" if ok else "error")
            for ok in (True, False)
        }
        self._rebuilds = {c: self.slice_rebuilds.labels(cause=c) for c in ("health", "claims")}

    @contextlib.contextmanager
    def request(
        self, operation: Operation, *, log: structlog.typing.FilteringBoundLogger | None = None
    ) -> Iterator[RequestTimer]:
        """Time one claim's prepare/unprepare; an escaping exception counts as an error.

        With ``log`` (bind the claim's namespace/name/UID to it, see
        :func:`dra_driver.logs.claim_logger`) it also emits the one event per request: operation,
        devices, duration and result (and the error, if any).

        >>> with metrics.request("prepare", log=claim_log) as req:
        ...     req.devices = ["gpu-0"]   # or: req.fail("why")
        """
        gauge = self._in_flight.get(operation)
        if gauge is None:
            raise _bad(operation, OPERATIONS, "operation")
        timer = RequestTimer()
        gauge.inc()
        start = time.perf_counter()
        try:
            yield timer
        except BaseException as exc:
            timer.fail(f"{type(exc).__name__}: {exc}")
            raise
        finally:
            gauge.dec()
            seconds = time.perf_counter() - start
            self.observe_request(operation, result=timer.result, seconds=seconds)
            if log is not None:
                _log_request(log, operation, timer, seconds)

    def observe_request(self, operation: Operation, *, result: Result, seconds: float) -> None:
        """Record a finished request measured elsewhere."""
        counter = self._requests.get((operation, result))
        if counter is None:
            if operation not in OPERATIONS:
                raise _bad(operation, OPERATIONS, "operation")
            raise _bad(result, RESULTS, "result")
        if seconds < 0:
            raise MetricsError(f"request duration: {seconds} s is negative")
        counter.inc()
        self._duration[operation].observe(seconds)

    def set_prepared(self, *, claims: int, devices: int) -> None:
        """The node's prepared state after a prepare/unprepare (or a checkpoint load)."""
        if claims < 0 or devices < 0:
            raise MetricsError(f"prepared state: claims={claims} devices={devices} is negative")
        self.prepared_claims.set(claims)
        self.prepared_devices.set(devices)

    def slice_publish(self, *, ok: bool, slices: int | None = None) -> None:
        """One reconcile pass of the slice publisher; ``slices`` = count now published."""
        self._slice_publishes[bool(ok)].inc()
        if ok and slices is not None:
            if slices < 0:
                raise MetricsError(f"published slices: {slices} is negative")
            self.slices.set(slices)

    def slices_rebuilt(self, *, health: bool, claims: bool, held_gpus: int) -> None:
        """The desired slices were rebuilt for a change of ``health``, of what ``claims`` hold,
        or both; ``held_gpus``: how many full GPUs they hold now."""
        if health:
            self._rebuilds["health"].inc()
        if claims:
            self._rebuilds["claims"].inc()
        self.held_gpus.set(held_gpus)

    def set_capacity(self, cap: setcapacity.SetCapacity) -> None:
        """The node's set capacity now (:class:`~dra_driver.setmetrics.SetCapacityGauges`)."""
        self.capacity.set(cap)

    def set_feature(self, feature: str, enabled: bool) -> None:
        """Whether the agent can publish with ``feature`` (one of :data:`FEATURES`)."""
        if feature not in FEATURES:
            raise _bad(feature, FEATURES, "feature")
        self.feature_enabled.labels(feature=feature).set(1 if enabled else 0)

    def nvml_error(self, call: str) -> None:
        """An NVML call failed; ``call`` is a short fixed name such as ``"discover"``."""
        if not call or len(call) > 64:
            raise MetricsError(f"nvml error call name {call!r}: must be 1-64 characters")
        self.nvml_errors.labels(call=call).inc()

    def set_device_health(self, device: str, reason: str) -> None:
        """``device`` is healthy (``reason == ""``) or unhealthy for ``reason``."""
        with self._health_lock:
            old = self._health_reason.get(device)
            if old == reason:
                return
            if old is not None:
                self.device_health.remove(device, old)
            self._health_reason[device] = reason
            self.device_health.labels(device=device, reason=reason).set(0 if reason else 1)

    def health_event(self, kind: str, xid: str, outcome: str) -> None:
        """One NVML health event: its kind, the XID ("" for others) and what it caused."""
        self.health_events.labels(kind=kind, xid=xid, outcome=outcome).inc()

    def device_recovered(self, device: str) -> None:
        self.device_recoveries.labels(device=device).inc()

    def mps_daemon_restarted(self, *, runner: str, reason: str, lost_clients: int) -> None:
        """An MPS daemon in use was restarted; ``lost_clients`` claims lost their server."""
        self.mps_daemon_restarts.labels(runner=runner, reason=reason).inc()
        self.mps_lost_clients.labels(runner=runner).inc(lost_clients)


def _log_request(
    log: structlog.typing.FilteringBoundLogger,
    operation: Operation,
    timer: RequestTimer,
    seconds: float,
) -> None:
    fields = {
        "operation": operation,
        "devices": list(timer.devices),
        "duration_ms": round(seconds * 1000, 3),
        "result": timer.result,
    }
    if timer.result == "success":
        log.info(f"claim {operation}d", **fields)
    else:
        log.warning(f"claim {operation} failed", error=timer.error, **fields)


def _bad(value: str, allowed: tuple[str, ...], what: str) -> MetricsError:
    return MetricsError(f"{what} {value!r}: must be one of {', '.join(allowed)}")


def new() -> DriverMetrics:
    """Metrics in a fresh registry of their own (what the composition root uses)."""
    return DriverMetrics(registry=prom.CollectorRegistry(auto_describe=True))
