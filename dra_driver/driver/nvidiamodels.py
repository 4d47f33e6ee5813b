"""The pydantic models of NVIDIA's ``resource.nvidia.com/v1beta1`` configs, and their meaning.

Why its own module: most claims carry no opaque config, and a node agent that never decodes one
should not load pydantic and build these models (memory on every GPU node).
:func:`dra_driver.driver.config.decode` imports this module only when there is an NVIDIA config
to decode and calls :func:`decode`; the API, its defaults and its meaning are described in
:mod:`dra_driver.driver.nvidia_config`. The class names are part of the error text (pydantic
names the model it expected), so they stay as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

import pydantic

from dra_driver.driver import nvidia_config

_STRICT = pydantic.ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


def _quantity_text(value: object) -> str:
    """A quantity as JSON gives it (a string, or a number as Go's Quantity also accepts)."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ValueError("must be a quantity string such as 10Gi")
    text = str(value)
    nvidia_config.memory_limit(text)
    return text


LimitText = Annotated[str, pydantic.BeforeValidator(_quantity_text)]


class MpsConfig(pydantic.BaseModel):
    model_config = _STRICT
    default_active_thread_percentage: int | None = pydantic.Field(
        default=None, alias="defaultActiveThreadPercentage", strict=True
    )
    default_pinned_device_memory_limit: LimitText | None = pydantic.Field(
        default=None, alias="defaultPinnedDeviceMemoryLimit"
    )
    default_per_device_pinned_memory_limit: dict[str, LimitText] = pydantic.Field(
        default_factory=dict, alias="defaultPerDevicePinnedMemoryLimit"
    )

    @pydantic.field_validator("default_active_thread_percentage")
    @classmethod
    def _percentage(cls, value: int | None) -> int | None:
        if value is not None and value < 0:
            raise ValueError("active thread percentage must not be negative")
        if value is not None and value > 100:
            raise ValueError("active thread percentage must not be greater than 100")
        return value

    @pydantic.field_validator("default_per_device_pinned_memory_limit")
    @classmethod
    def _keys(cls, limits: dict[str, str]) -> dict[str, str]:
        for key in limits:
            nvidia_config.device_key(key)
        return limits

    def ours(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.default_active_thread_percentage is not None:
            out["activeThreadPercentage"] = self.default_active_thread_percentage
        if self.default_pinned_device_memory_limit is not None:
            out["pinnedDeviceMemoryLimit"] = self.default_pinned_device_memory_limit
        if self.default_per_device_pinned_memory_limit:
            out["perDevicePinnedMemoryLimits"] = dict(self.default_per_device_pinned_memory_limit)
        return out


class TimeSlicingConfig(pydantic.BaseModel):
    model_config = _STRICT
    interval: str | None = pydantic.Field(default=None, strict=True)


class GpuSharing(pydantic.BaseModel):
    model_config = _STRICT
    strategy: str = pydantic.Field(strict=True)
    time_slicing_config: TimeSlicingConfig | None = pydantic.Field(
        default=None, alias="timeSlicingConfig"
    )
    mps_config: MpsConfig | None = pydantic.Field(default=None, alias="mpsConfig")


class MigDeviceSharing(pydantic.BaseModel):
    model_config = _STRICT
    strategy: str = pydantic.Field(strict=True)
    mps_config: MpsConfig | None = pydantic.Field(default=None, alias="mpsConfig")


class GpuConfig(pydantic.BaseModel):
    model_config = _STRICT
    api_version: Literal["resource.nvidia.com/v1beta1"] = pydantic.Field(alias="apiVersion")
    kind: Literal["GpuConfig"]
    sharing: GpuSharing | None = None


class MigDeviceConfig(pydantic.BaseModel):
    model_config = _STRICT
    api_version: Literal["resource.nvidia.com/v1beta1"] = pydantic.Field(alias="apiVersion")
    kind: Literal["MigDeviceConfig"]
    sharing: MigDeviceSharing | None = None


def _strategy(strategy: str) -> None:
    if strategy in ("TimeSlicing", "MPS"):
        return
    if strategy == "Fabric":
        raise nvidia_config.NvidiaConfigError(
            "field sharing.strategy: fabric GPU sharing strategy is not enabled"
        )
    raise nvidia_config.NvidiaConfigError(
        f"field sharing.strategy: unknown GPU sharing strategy: {strategy}"
    )


def _gpu_sharing(sharing: GpuSharing | None) -> dict[str, Any]:
    if sharing is None:  # NVIDIA's normalisation: time-slicing with the default interval
        return {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Default"}}
    _strategy(sharing.strategy)
    if sharing.strategy == "TimeSlicing":
        if sharing.mps_config is not None:
            raise nvidia_config.NvidiaConfigError(
                "field sharing.mpsConfig: cannot use MpsConfig with the 'TimeSlicing' strategy"
            )
        slicing = sharing.time_slicing_config
        interval = slicing.interval if slicing is not None and slicing.interval else "Default"
        if interval not in nvidia_config.INTERVALS:
            raise nvidia_config.NvidiaConfigError(
                f"field sharing.timeSlicingConfig.interval: unknown time-slice interval: {interval}"
            )
        return {"strategy": "TimeSlicing", "timeSlicing": {"interval": interval}}
    if sharing.time_slicing_config is not None:
        raise nvidia_config.NvidiaConfigError(
            "field sharing.timeSlicingConfig: cannot use TimeSlicingConfig with the 'MPS' strategy"
        )
    return {"strategy": "MPS", "mps": (sharing.mps_config or MpsConfig()).ours()}


def _mig_sharing(sharing: MigDeviceSharing | None) -> dict[str, Any]:
    if sharing is None:
        raise nvidia_config.NvidiaConfigError("field sharing: no sharing strategy set")
    _strategy(sharing.strategy)
    if sharing.strategy == "TimeSlicing":
        if sharing.mps_config is not None:
            raise nvidia_config.NvidiaConfigError(
                "field sharing.mpsConfig: cannot use MpsConfig with the 'TimeSlicing' strategy"
            )
        # NVIDIA's driver applies nothing for time-slicing on a MIG device (its compute is
        # already partitioned): the device is prepared as it is.
        return {"strategy": "Exclusive"}
    return {"strategy": "MPS", "mps": (sharing.mps_config or MpsConfig()).ours()}


def _validate(model: type[GpuConfig] | type[MigDeviceConfig], params: Mapping[str, Any]) -> Any:
    try:
        return model.model_validate(dict(params))
    except pydantic.ValidationError as exc:
        problems = "; ".join(nvidia_config.describe(e) for e in exc.errors())
        raise nvidia_config.NvidiaConfigError(problems) from None


def decode(params: Mapping[str, Any]) -> tuple[Literal["gpu", "mig"], dict[str, Any]]:
    """Decode, default and validate one config: (the device kind it is for, our ``sharing``)."""
    kind = params.get("kind")
    if kind == nvidia_config.GPU_CONFIG:
        gpu = _validate(GpuConfig, params)
        return "gpu", _gpu_sharing(gpu.sharing)
    if kind == nvidia_config.MIG_DEVICE_CONFIG:
        mig = _validate(MigDeviceConfig, params)
        return "mig", _mig_sharing(mig.sharing)
    raise nvidia_config.NvidiaConfigError(
        f"unsupported kind {kind!r} of {nvidia_config.API_VERSION} (this driver understands "
        f"{' and '.join(nvidia_config.KINDS)})"
    )
