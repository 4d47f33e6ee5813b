"""Sampling a GPU's utilization, memory, power and temperature through NVML, for the metrics.

Why it exists: sampling is a separate job from discovery — a background thread asks the same
few questions of every GPU again and again and must never stop on an error, where discovery reads
everything once and skips a GPU it cannot model. The backend hands one out
(:meth:`~dra_driver.devices.nvml.PynvmlBackend.sampler`) over the NVML module it was created
with, so fake nodes are sampled through the very same code.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dra_driver.devices import backend, nvmlapi


class NvmlSampler:
    """One NVML pass over the given GPUs: utilization, memory, power, temperature
    (:class:`~dra_driver.devices.backend.GpuSampler`). A value NVML cannot give for a GPU
    (NotSupported, NoPermission, a lost GPU, any NVMLError) is left None and its name listed in
    the sample's ``errors``; a GPU whose handle cannot be found has every value None. Handles
    are looked up once per UUID and kept. Not thread-safe: one sampling thread calls it."""

    def __init__(self, api: nvmlapi.NvmlApi) -> None:
        self._nvml = api
        self._handles: dict[str, Any] = {}

    def reset(self) -> None:
        """Forget the handles (NVML was shut down, or the GPUs changed): looked up again."""
        self._handles.clear()

    def sample(self, uuids: Sequence[str]) -> dict[str, backend.GpuSample]:
        return {uuid: self._one(uuid) for uuid in uuids}

    def _one(self, uuid: str) -> backend.GpuSample:
        api = self._nvml
        handle = self._handles.get(uuid)
        if handle is None:
            try:
                handle = api.nvmlDeviceGetHandleByUUID(uuid)
            except nvmlapi.NVMLError:
                return backend.GpuSample(uuid=uuid, errors=backend.SAMPLE_VALUES)
            self._handles[uuid] = handle
        errors: list[str] = []
        gpu_util = mem_util = used = total = power = temperature = None
        try:
            rates = api.nvmlDeviceGetUtilizationRates(handle)
            gpu_util, mem_util = float(rates.gpu), float(rates.memory)
        except nvmlapi.NVMLError:
            errors.append("utilization")
        try:
            mem = api.nvmlDeviceGetMemoryInfo(handle)
            used, total = int(mem.used), int(mem.total)
        except nvmlapi.NVMLError:
            errors.append("memory")
        try:
            power = int(api.nvmlDeviceGetPowerUsage(handle)) / 1000.0  # milliwatts
        except nvmlapi.NVMLError:
            errors.append("power")
        try:
            temperature = float(api.nvmlDeviceGetTemperature(handle, nvmlapi.NVML_TEMPERATURE_GPU))
        except nvmlapi.NVMLError:
            errors.append("temperature")
        if errors and len(errors) == len(backend.SAMPLE_VALUES):
            self._handles.pop(uuid, None)  # look it up again next time (a GPU reset, ...)
        return backend.GpuSample(
            uuid=uuid,
            gpu_util_percent=gpu_util,
            memory_util_percent=mem_util,
            memory_used_bytes=used,
            memory_total_bytes=total,
            power_watts=power,
            temperature_celsius=temperature,
            errors=tuple(errors),
        )
