"""Our opaque device configuration (``gpu.nvidia.com/v1`` ``GpuConfig``), decoded strictly.

DeviceClasses and ResourceClaims carry driver-specific parameters as opaque JSON that the API
server never looks inside, so this is the only place a typo can be caught. Decoding is strict
(unknown fields are errors naming the claim, the config entry and the field) rather than
forgiving: a silently ignored ``sharng:`` would give a user exclusive GPUs they did not ask for.

The format, kept deliberately small::

    apiVersion: gpu.nvidia.com/v1
    kind: GpuConfig
    sharing:                      # optional
      strategy: Exclusive | TimeSlicing | MPS
      timeSlicing:                # only with strategy TimeSlicing
        interval: Default | Short | Medium | Long
      mps:                        # only with strategy MPS
        activeThreadPercentage: 50          # optional, 0..100
        pinnedDeviceMemoryLimit: 10Gi       # optional, every device of the claim
        perDevicePinnedMemoryLimits:        # optional, by device UUID or index
          "0": 4Gi
    env:                          # optional, extra environment for the containers
      NAME: value

NVIDIA's ``resource.nvidia.com/v1beta1`` ``GpuConfig`` / ``MigDeviceConfig`` are accepted too
(:mod:`dra_driver.driver.nvidia_config` decodes them into the same ``sharing``).

Several configs can apply to one device (class configs first, then claim configs); they are
merged in that order: a later ``sharing`` replaces an earlier one, ``env`` entries are merged
with later values winning.

This module only decodes and merges. The merged ``sharing`` is applied to the GPU at prepare by
:mod:`dra_driver.driver.sharing` (time-slicing) and :mod:`dra_driver.driver.mps` (MPS), and
restored at unprepare; ``env`` goes into the claim's CDI spec (:mod:`dra_driver.driver.cdi`); the
user-facing description is ``docs/config.md``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Final, Literal, TypeVar

import pydantic

from dra_driver.driver import claims, nvidia_config

API_VERSION: Final = "gpu.nvidia.com/v1"
KIND: Final = "GpuConfig"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_STRICT = pydantic.ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class ConfigError(claims.ClaimError):
    """An opaque config of our driver does not decode; names the claim, entry and field."""


class TimeSlicing(pydantic.BaseModel):
    model_config = _STRICT
    interval: Literal["Default", "Short", "Medium", "Long"] = "Default"


def memory_limit(text: str) -> int:
    """A pinned-memory limit in bytes: a quantity of at least 1Mi (MPS takes whole MiB)."""
    return nvidia_config.memory_limit(text)


class Mps(pydantic.BaseModel):
    """Limits for the processes of a claim that uses a GPU through MPS."""

    model_config = _STRICT
    active_thread_percentage: int | None = pydantic.Field(
        default=None, alias="activeThreadPercentage", ge=0, le=100, strict=True
    )
    pinned_device_memory_limit: str | None = pydantic.Field(
        default=None, alias="pinnedDeviceMemoryLimit"
    )
    per_device_pinned_memory_limits: dict[str, str] | None = pydantic.Field(
        default=None, alias="perDevicePinnedMemoryLimits"
    )

    @pydantic.field_validator("pinned_device_memory_limit")
    @classmethod
    def _limit(cls, text: str | None) -> str | None:
        if text is not None:
            memory_limit(text)
        return text

    @pydantic.field_validator("per_device_pinned_memory_limits")
    @classmethod
    def _limits(cls, limits: dict[str, str] | None) -> dict[str, str] | None:
        for key, text in (limits or {}).items():
            nvidia_config.device_key(key)
            memory_limit(text)
        return limits


class Sharing(pydantic.BaseModel):
    model_config = _STRICT
    strategy: Literal["Exclusive", "TimeSlicing", "MPS"]
    time_slicing: TimeSlicing | None = pydantic.Field(default=None, alias="timeSlicing")
    mps: Mps | None = None

    @pydantic.model_validator(mode="after")
    def _settings_match_strategy(self) -> Sharing:
        if self.time_slicing is not None and self.strategy != "TimeSlicing":
            raise ValueError("timeSlicing may only be set with strategy TimeSlicing")
        if self.mps is not None and self.strategy != "MPS":
            raise ValueError("mps may only be set with strategy MPS")
        return self


class GpuConfig(pydantic.BaseModel):
    """One decoded config entry (or the merge of several)."""

    model_config = _STRICT
    api_version: Literal["gpu.nvidia.com/v1"] = pydantic.Field(alias="apiVersion")
    kind: Literal["GpuConfig"]
    sharing: Sharing | None = None
    env: dict[str, str] = pydantic.Field(default_factory=dict)

    @pydantic.field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        for name in env:
            if not _ENV_NAME.match(name):
                raise ValueError(f"{name!r} is not a valid environment variable name")
        return env

    def to_json(self) -> dict[str, object]:
        """The JSON form (as a user would write it), for the checkpoint."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


DEFAULT = GpuConfig(apiVersion=API_VERSION, kind=KIND)
_BASE: Final = {"apiVersion": API_VERSION, "kind": KIND}


def decode_for(entry: claims.OpaqueConfig, *, ref: claims.ClaimRef) -> tuple[str | None, GpuConfig]:
    """Decode one entry of either API: (the device kind it is written for, None = any; config)."""
    where = f"{ref}: opaque {entry.describe()}"
    params = entry.parameters
    if params.get("apiVersion") == nvidia_config.API_VERSION:
        try:
            kind, sharing = nvidia_config.decode(params)
        except nvidia_config.NvidiaConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        return kind, validate(GpuConfig, {**_BASE, "sharing": sharing}, where)
    if params.get("apiVersion") != API_VERSION or params.get("kind") != KIND:
        raise ConfigError(
            f"{where}: unsupported apiVersion/kind {params.get('apiVersion')!r}/"
            f"{params.get('kind')!r} (this driver understands {API_VERSION} {KIND}, and "
            f"{nvidia_config.API_VERSION} {' and '.join(nvidia_config.KINDS)})"
        )
    return None, validate(GpuConfig, params, where)


def decode(entry: claims.OpaqueConfig, *, ref: claims.ClaimRef) -> GpuConfig:
    """Decode one opaque config entry; :class:`ConfigError` names the claim, entry and field."""
    return decode_for(entry, ref=ref)[1]


ModelT = TypeVar("ModelT", bound=pydantic.BaseModel)


def validate(model: type[ModelT], params: Mapping[str, Any], where: str) -> ModelT:
    """Strict decoding of ``params`` as ``model``; :class:`ConfigError` naming every field."""
    try:
        return model.model_validate(dict(params))
    except pydantic.ValidationError as exc:
        problems = "; ".join(nvidia_config.describe(err) for err in exc.errors())
        raise ConfigError(f"{where}: {problems}") from None


def effective(
    entries: Iterable[claims.OpaqueConfig], *, ref: claims.ClaimRef, kind: str = "gpu"
) -> GpuConfig:
    """Decode and merge, in order, every config applying to one device of ``kind``.

    An entry written for the other kind of device (NVIDIA's ``GpuConfig`` for a full GPU,
    ``MigDeviceConfig`` for a MIG device) is skipped when it applies to the whole claim and is an
    error when it names the device's request, as in NVIDIA's driver.
    """
    merged = DEFAULT
    for entry in entries:
        wanted_kind, cfg = decode_for(entry, ref=ref)
        if wanted_kind is not None and wanted_kind != kind:
            if not entry.requests:
                continue
            raise ConfigError(
                f"{ref}: opaque {entry.describe()}: {entry.parameters.get('kind')} is for "
                f"{_KIND_WORDS[wanted_kind]} and cannot be applied to request(s) "
                f"{', '.join(entry.requests)}, which got {_KIND_WORDS[kind]}"
            )
        merged = GpuConfig(
            apiVersion=API_VERSION,
            kind=KIND,
            sharing=cfg.sharing if cfg.sharing is not None else merged.sharing,
            env={**merged.env, **cfg.env},
        )
    return merged


_KIND_WORDS = {"gpu": "full GPUs", "mig": "MIG devices"}
