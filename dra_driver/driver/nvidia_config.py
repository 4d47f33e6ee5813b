"""NVIDIA's opaque config API, ``resource.nvidia.com/v1beta1`` ``GpuConfig`` / ``MigDeviceConfig``.

Why it exists: claims and DeviceClasses written for NVIDIA's DRA driver carry these configs, and
they must work here unchanged. This module is our own model of that API (written from its
published field list, not copied): it decodes strictly, as NVIDIA's driver does (unknown field,
wrong JSON type, unknown strategy or interval: an error), fills in the same implied defaults, and
translates the result into our ``sharing`` (:class:`dra_driver.driver.config.Sharing`, as JSON).

The meaning, as in NVIDIA's driver:

* ``GpuConfig`` applies to full GPUs only, ``MigDeviceConfig`` to MIG devices only (see
  :func:`dra_driver.driver.config.effective` for how a mismatch is handled).
* ``GpuConfig`` without ``sharing`` means time-slicing with the ``Default`` interval; with
  ``strategy: TimeSlicing`` and no ``timeSlicingConfig`` likewise.
* ``MigDeviceConfig`` must say ``sharing``; ``TimeSlicing`` on a MIG device changes nothing
  (our ``Exclusive``); ``MPS`` runs an MPS control daemon for the device.
* ``mpsConfig``: ``defaultActiveThreadPercentage`` (0..100), ``defaultPinnedDeviceMemoryLimit``
  (a quantity, whole MiB, at least 1Mi) for every device, ``defaultPerDevicePinnedMemoryLimit``
  (device UUID or index → quantity) overriding it per device. Note the field name is singular in
  NVIDIA's API.
* ``timeSlicingConfig`` with strategy MPS, or ``mpsConfig`` with TimeSlicing, is an error (NVIDIA's
  driver fails the claim when it applies such a config).

No dependency on the rest of the driver: :mod:`dra_driver.driver.config` calls :func:`decode`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal

import pydantic
import pydantic_core

from dra_driver.apimachinery import quantity

API_VERSION: Final = "resource.nvidia.com/v1beta1"
GPU_CONFIG: Final = "GpuConfig"
MIG_DEVICE_CONFIG: Final = "MigDeviceConfig"
KINDS: Final = (GPU_CONFIG, MIG_DEVICE_CONFIG)
INTERVALS: Final = ("Default", "Short", "Medium", "Long")
_MIB = 1 << 20
_STRICT = pydantic.ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
# A per-device key: a GPU/MIG UUID (as NVML prints it) or the device's index among the devices.
_DEVICE_KEY = re.compile(r"^(?:\d{1,3}|(?:GPU|MIG)-[0-9A-Za-z-]{1,80})$")


class NvidiaConfigError(ValueError):
    """The config does not decode or is not valid; the message names the field."""


def memory_limit(text: str) -> int:
    """A pinned-memory limit in bytes: a quantity of whole bytes, at least 1Mi."""
    try:
        value = quantity.parse_quantity(text)
    except quantity.QuantityError as exc:
        raise ValueError(f"{text!r} is not a quantity: {exc}") from None
    if not value.is_integer() or value.as_integer() < _MIB:
        raise ValueError(f"{text!r}: value set too low (MPS limits are whole MiB, at least 1Mi)")
    return value.as_integer()


def device_key(key: str) -> str:
    if not _DEVICE_KEY.match(key):
        raise ValueError(f"{key!r} is neither a device UUID nor a device index")
    return key


def _quantity_text(value: object) -> str:
    """A quantity as JSON gives it (a string, or a number as Go's Quantity also accepts)."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ValueError("must be a quantity string such as 10Gi")
    text = str(value)
    memory_limit(text)
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
            device_key(key)
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


def decode(params: Mapping[str, Any]) -> tuple[Literal["gpu", "mig"], dict[str, Any]]:
    """Decode, default and validate one config: (the device kind it is for, our ``sharing``)."""
    kind = params.get("kind")
    if kind == GPU_CONFIG:
        gpu = _validate(GpuConfig, params)
        return "gpu", _gpu_sharing(gpu.sharing)
    if kind == MIG_DEVICE_CONFIG:
        mig = _validate(MigDeviceConfig, params)
        return "mig", _mig_sharing(mig.sharing)
    raise NvidiaConfigError(
        f"unsupported kind {kind!r} of {API_VERSION} (this driver understands "
        f"{' and '.join(KINDS)})"
    )


def _strategy(strategy: str) -> None:
    if strategy in ("TimeSlicing", "MPS"):
        return
    if strategy == "Fabric":
        raise NvidiaConfigError(
            "field sharing.strategy: fabric GPU sharing strategy is not enabled"
        )
    raise NvidiaConfigError(f"field sharing.strategy: unknown GPU sharing strategy: {strategy}")


def _gpu_sharing(sharing: GpuSharing | None) -> dict[str, Any]:
    if sharing is None:  # NVIDIA's normalisation: time-slicing with the default interval
        return {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Default"}}
    _strategy(sharing.strategy)
    if sharing.strategy == "TimeSlicing":
        if sharing.mps_config is not None:
            raise NvidiaConfigError(
                "field sharing.mpsConfig: cannot use MpsConfig with the 'TimeSlicing' strategy"
            )
        slicing = sharing.time_slicing_config
        interval = slicing.interval if slicing is not None and slicing.interval else "Default"
        if interval not in INTERVALS:
            raise NvidiaConfigError(
                f"field sharing.timeSlicingConfig.interval: unknown time-slice interval: {interval}"
            )
        return {"strategy": "TimeSlicing", "timeSlicing": {"interval": interval}}
    if sharing.time_slicing_config is not None:
        raise NvidiaConfigError(
            "field sharing.timeSlicingConfig: cannot use TimeSlicingConfig with the 'MPS' strategy"
        )
    return {"strategy": "MPS", "mps": (sharing.mps_config or MpsConfig()).ours()}


def _mig_sharing(sharing: MigDeviceSharing | None) -> dict[str, Any]:
    if sharing is None:
        raise NvidiaConfigError("field sharing: no sharing strategy set")
    _strategy(sharing.strategy)
    if sharing.strategy == "TimeSlicing":
        if sharing.mps_config is not None:
            raise NvidiaConfigError(
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
        raise NvidiaConfigError("; ".join(describe(e) for e in exc.errors())) from None


def describe(err: pydantic_core.ErrorDetails) -> str:
    """One pydantic error as ``field a.b: reason`` (shared with our own config's decoder)."""
    field = ".".join(str(part) for part in err["loc"]) or "(top level)"
    if err["type"] == "extra_forbidden":
        return f"field {field}: unknown field"
    if err["type"] == "missing":
        return f"field {field}: required field is missing"
    message = err["msg"].removeprefix("Value error, ")
    return f"field {field}: {message}"
