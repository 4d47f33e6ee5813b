"""Per-claim GPU metrics: which claim (and pod) holds which physical GPU, and its telemetry.

Why it exists: an operator must see, per prepared device, the GPU it uses and how busy that GPU
is, labelled with the claim and pod that hold it, without running DCGM. Two parts:

- :class:`GpuMetrics` samples every GPU of the node once per ``--gpu-metrics-interval`` on its own
  daemon thread (ONE NVML pass per interval; never on the prepare path) and keeps the last sample.
- It is also a custom prometheus collector: a scrape joins the last sample with the prepared
  claims (:class:`~dra_driver.driver.claiminfo.PreparedClaims`, in memory), so it never calls NVML
  or the API server and never waits for a sampling pass; an unprepared claim's series are gone
  from the next scrape.

A value NVML refuses for a GPU (NotSupported, ...) is skipped and counted in
``dra_driver_gpu_sample_errors_total{gpu_uuid, metric}``; the first refusal per GPU and value is
logged. The GPUs sampled follow the node (:meth:`GpuMetrics.set_devices`, docs/lifecycle.md): a
hot-added GPU is sampled from the next pass, a vanished one's telemetry series go at once (a claim
that still holds it keeps its ``claim_device_info`` line); while the NVIDIA driver is away or
released (:meth:`GpuMetrics.pause`) nothing is sampled and no telemetry is shown, never a frozen
last value. Series under NVIDIA's DCGM exporter names (``DCGM_FI_DEV_GPU_UTIL``, ...) with its
labels are offered too (docs/metrics.md maps ours to theirs).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping, Sequence

import structlog
from prometheus_client import registry as prom_registry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from dra_driver import logs
from dra_driver.devices import backend, model
from dra_driver.driver import claiminfo

DEFAULT_INTERVAL_S = 15.0
NAMESPACE = "dra_driver"
CLAIM_LABELS = ("namespace", "claim", "claim_uid", "pod", "device", "gpu_uuid", "gpu_minor")
DCGM_LABELS = ("gpu", "UUID", "device", "modelName", "Hostname", "namespace", "pod", "container")
_MIB = 1 << 20

# Ours: name, help, the GpuSample field, scale. NVIDIA's: name, help, field, scale.
_OURS: tuple[tuple[str, str, str, float], ...] = (
    ("gpu_utilization_percent", "GPU utilization (%), NVML.", "gpu_util_percent", 1.0),
    (
        "gpu_memory_utilization_percent",
        "Share of time GPU memory was read or written (%), NVML.",
        "memory_util_percent",
        1.0,
    ),
    ("gpu_memory_used_bytes", "GPU memory used (bytes), NVML.", "memory_used_bytes", 1.0),
    ("gpu_memory_total_bytes", "GPU memory in total (bytes), NVML.", "memory_total_bytes", 1.0),
    ("gpu_power_watts", "GPU power draw (W), NVML.", "power_watts", 1.0),
    ("gpu_temperature_celsius", "GPU temperature (°C), NVML.", "temperature_celsius", 1.0),
)
_DCGM: tuple[tuple[str, str, str, float], ...] = (
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", "gpu_util_percent", 1.0),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", "memory_util_percent", 1.0),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", "memory_used_bytes", 1 / _MIB),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", "power_watts", 1.0),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", "temperature_celsius", 1.0),
)

_log = logs.get("gpu-metrics")


class GpuMetrics(prom_registry.Collector):
    """Samples ``devices``' GPUs every ``interval_s`` (0: never) and collects per-claim series."""

    def __init__(
        self,
        *,
        sampler: backend.GpuSampler | None,
        devices: model.NodeDevices,
        claims: claiminfo.PreparedClaims,
        interval_s: float = DEFAULT_INTERVAL_S,
        node_name: str = "",
        nvidia_names: bool = True,
        log: structlog.typing.FilteringBoundLogger | None = None,
    ) -> None:
        if interval_s < 0:
            raise ValueError(f"GPU metrics interval {interval_s}: must not be negative")
        self.sampler = sampler
        self.claims = claims
        self.interval_s = interval_s if sampler is not None else 0.0
        self.node_name = node_name
        self.nvidia_names = nvidia_names
        self.log = log or _log
        self._uuids = tuple(g.uuid for g in devices.gpus)
        self._models = {g.uuid: g.product_name for g in devices.gpus}
        self._lock = threading.Lock()
        self._reset_due = False
        self._last: Mapping[str, backend.GpuSample] = {}
        self._last_at = 0.0
        self._last_seconds = 0.0
        self._passes = 0
        self._errors: dict[tuple[str, str], int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._registry: prom_registry.CollectorRegistry | None = None

    # --- sampling -----------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start the sampling thread (not with an interval of 0 or no sampler)."""
        if self.interval_s <= 0 or self._thread is not None:
            return
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu-metrics", daemon=True)
        self._thread.start()

    def set_devices(self, devices: model.NodeDevices) -> None:
        """Sample ``devices``' GPUs from the next pass on; series of GPUs gone end now."""
        uuids = tuple(g.uuid for g in devices.gpus)
        with self._lock:
            self._uuids = uuids
            self._models = {g.uuid: g.product_name for g in devices.gpus}
            self._last = {u: s for u, s in self._last.items() if u in uuids}
            self._reset_due = True

    def pause(self) -> None:
        """Stop sampling (the NVIDIA driver is away or released: no NVML calls) and drop the
        last sample, so no telemetry freezes at its last value; :meth:`resume` starts again."""
        thread, self._thread = self._thread, None
        self._stop.set()
        if thread is not None and thread.is_alive():
            thread.join(timeout=10)
        with self._lock:
            self._last = {}
            self._reset_due = True  # handles from before nvmlShutdown are not used again

    def resume(self) -> None:
        """Sample again after :meth:`pause` (a no-op while sampling)."""
        if self._registry is not None:
            self.start()

    def stop(self) -> None:
        """Stop sampling; series leave the registry :func:`start` put them in."""
        self._stop.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout=10)
        registry, self._registry = self._registry, None
        if registry is not None:
            registry.unregister(self)

    def _run(self) -> None:
        while True:
            try:
                self.sample_once()
            except Exception:  # never let the sampler die; the next pass retries
                self.log.exception("GPU metrics sampling pass failed")
            if self._stop.wait(self.interval_s):
                return

    def sample_once(self) -> Mapping[str, backend.GpuSample]:
        """One NVML pass over every GPU; the result replaces the last sample."""
        if self.sampler is None:
            return {}
        start = time.perf_counter()
        with self._lock:
            uuids, reset, self._reset_due = self._uuids, self._reset_due, False
        forget = getattr(self.sampler, "reset", None)  # the sampler's handles (NvmlSampler)
        if reset and callable(forget):
            forget()
        found = self.sampler.sample(uuids)
        seconds = time.perf_counter() - start
        first: list[tuple[str, str]] = []
        with self._lock:
            for sample in found.values():
                for value in sample.errors:
                    key = (sample.uuid, value)
                    if key not in self._errors:
                        first.append(key)
                    self._errors[key] = self._errors.get(key, 0) + 1
            self._last = {u: s for u, s in found.items() if u in self._uuids}
            self._last_at = time.time()
            self._last_seconds = seconds
            self._passes += 1
        for uuid, value in first:
            self.log.warning("GPU metric not readable", gpu_uuid=uuid, metric=value)
        return found

    # --- prometheus collector -----------------------------------------------------------------
    def describe(self) -> Sequence[Metric]:
        """Nothing up front: series come and go with the prepared claims."""
        return ()

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            last, errors, models = self._last, dict(self._errors), self._models
            at, seconds, passes = self._last_at, self._last_seconds, self._passes
        snapshot = self.claims.snapshot()
        info = GaugeMetricFamily(
            f"{NAMESPACE}_claim_device_info",
            "1 per prepared device and physical GPU it uses; labels name the claim, its pods, "
            "the device and the GPU.",
            labels=CLAIM_LABELS,
        )
        ours = {
            field: GaugeMetricFamily(f"{NAMESPACE}_{name}", text, labels=CLAIM_LABELS)
            for name, text, field, _ in _OURS
        }
        dcgm = {
            field: (GaugeMetricFamily(name, text, labels=DCGM_LABELS), scale)
            for name, text, field, scale in _DCGM
        }
        free = GaugeMetricFamily(
            "DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", labels=DCGM_LABELS
        )
        for claim in snapshot:
            pods = ",".join(claim.pods)
            for gpu in claim.gpus:
                labels = [
                    claim.namespace,
                    claim.name,
                    claim.uid,
                    pods,
                    gpu.device,
                    gpu.gpu_uuid,
                    str(gpu.gpu_minor),
                ]
                info.add_metric(labels, 1)
                sample = last.get(gpu.gpu_uuid)
                if sample is None:
                    continue
                for field, family in ours.items():
                    value = getattr(sample, field)
                    if value is not None:
                        family.add_metric(labels, value)
                if not self.nvidia_names:
                    continue
                theirs = [
                    str(gpu.gpu_minor),
                    gpu.gpu_uuid,
                    f"nvidia{gpu.gpu_minor}",
                    models.get(gpu.gpu_uuid, ""),
                    self.node_name,
                    claim.namespace,
                    pods,
                    "",
                ]
                for field, (family, scale) in dcgm.items():
                    value = getattr(sample, field)
                    if value is not None:
                        family.add_metric(theirs, value * scale)
                used, total = sample.memory_used_bytes, sample.memory_total_bytes
                if used is not None and total is not None:
                    free.add_metric(theirs, (total - used) / _MIB)
        yield info
        yield from ours.values()
        if self.nvidia_names:
            yield from (family for family, _ in dcgm.values())
            yield free
        errs = CounterMetricFamily(
            f"{NAMESPACE}_gpu_sample_errors",
            "GPU metric values NVML could not give (NotSupported, ...), by GPU and metric.",
            labels=("gpu_uuid", "metric"),
        )
        for (uuid, value), count in sorted(errors.items()):
            errs.add_metric([uuid, value], count)
        yield errs
        passes_family = CounterMetricFamily(
            f"{NAMESPACE}_gpu_sample_passes", "GPU metrics sampling passes (one NVML pass each)."
        )
        passes_family.add_metric([], passes)
        yield passes_family
        if passes:
            when = GaugeMetricFamily(
                f"{NAMESPACE}_gpu_sample_timestamp_seconds",
                "Unix time of the last GPU metrics sampling pass.",
            )
            when.add_metric([], at)
            yield when
            took = GaugeMetricFamily(
                f"{NAMESPACE}_gpu_sample_duration_seconds",
                "How long the last GPU metrics sampling pass took.",
            )
            took.add_metric([], seconds)
            yield took


def start(
    *,
    registry: prom_registry.CollectorRegistry,
    backend_: object,
    devices: model.NodeDevices,
    claims: claiminfo.PreparedClaims,
    interval_s: float,
    node_name: str,
    log: structlog.typing.FilteringBoundLogger | None = None,
) -> GpuMetrics:
    """Register per-claim metrics in ``registry`` and start sampling with ``backend_``'s
    sampler (a backend without one: claim series only, no telemetry)."""
    make = getattr(backend_, "sampler", None)
    metrics = GpuMetrics(
        sampler=make() if callable(make) and interval_s > 0 else None,
        devices=devices,
        claims=claims,
        interval_s=interval_s,
        node_name=node_name,
        log=log,
    )
    registry.register(metrics)
    metrics._registry = registry
    metrics.start()
    return metrics
