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

This module only decodes and merges, and without pydantic where there is nothing to decode: a
device without config entries gets :data:`DEFAULT` at once, and the strict pydantic models
(:mod:`dra_driver.driver.configmodels`) are imported only for an entry to decode, then give
their result as the plain frozen dataclasses below, the one type callers ever see.

The merged ``sharing`` is applied to the GPU at prepare by :mod:`dra_driver.driver.sharing`
(time-slicing) and :mod:`dra_driver.driver.mps.daemons` (MPS), and restored at unprepare;
``env`` goes
into the claim's CDI spec (:mod:`dra_driver.driver.cdi`); the user-facing description is
``docs/config.md``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final, Literal

from dra_driver import records
from dra_driver.driver import claims, nvidia_config

if TYPE_CHECKING:
    from dra_driver.driver import configmodels

API_VERSION: Final = "gpu.nvidia.com/v1"
KIND: Final = "GpuConfig"


class ConfigError(claims.ClaimError):
    """An opaque config of our driver does not decode; names the claim, entry and field."""


def memory_limit(text: str) -> int:
    """A pinned-memory limit in bytes: a quantity of at least 1Mi (MPS takes whole MiB)."""
    return nvidia_config.memory_limit(text)


@records.record
class TimeSlicing:
    interval: Literal["Default", "Short", "Medium", "Long"] = "Default"

    def to_json(self) -> dict[str, object]:
        return {"interval": self.interval}


@records.record
class Mps:
    """Limits for the processes of a claim that uses a GPU through MPS."""

    active_thread_percentage: int | None = None
    pinned_device_memory_limit: str | None = None
    per_device_pinned_memory_limits: dict[str, str] | None = None

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {}
        if self.active_thread_percentage is not None:
            out["activeThreadPercentage"] = self.active_thread_percentage
        if self.pinned_device_memory_limit is not None:
            out["pinnedDeviceMemoryLimit"] = self.pinned_device_memory_limit
        if self.per_device_pinned_memory_limits is not None:
            out["perDevicePinnedMemoryLimits"] = dict(self.per_device_pinned_memory_limits)
        return out


@records.record
class Sharing:
    strategy: Literal["Exclusive", "TimeSlicing", "MPS"]
    time_slicing: TimeSlicing | None = None  # only with strategy TimeSlicing
    mps: Mps | None = None  # only with strategy MPS

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"strategy": self.strategy}
        if self.time_slicing is not None:
            out["timeSlicing"] = self.time_slicing.to_json()
        if self.mps is not None:
            out["mps"] = self.mps.to_json()
        return out


@records.record
class GpuConfig:
    """One decoded config entry (or the merge of several)."""

    api_version: Literal["gpu.nvidia.com/v1"] = API_VERSION
    kind: Literal["GpuConfig"] = KIND
    sharing: Sharing | None = None
    env: dict[str, str] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        """The JSON form (as a user would write it), for the checkpoint."""
        out: dict[str, object] = {"apiVersion": self.api_version, "kind": self.kind}
        if self.sharing is not None:
            out["sharing"] = self.sharing.to_json()
        out["env"] = dict(self.env)
        return out


DEFAULT: Final = GpuConfig()


def decode_for(entry: claims.OpaqueConfig, *, ref: claims.ClaimRef) -> tuple[str | None, GpuConfig]:
    """Decode one entry of either API: (the device kind it is written for, None = any; config)."""
    where = f"{ref}: opaque {entry.describe()}"
    params = entry.parameters
    if params.get("apiVersion") == nvidia_config.API_VERSION:
        from dra_driver.driver import nvidiamodels  # pydantic: only for a config to decode

        try:
            kind, sharing = nvidiamodels.decode(params)
        except nvidia_config.NvidiaConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        return kind, _decoded({"apiVersion": API_VERSION, "kind": KIND, "sharing": sharing}, where)
    if params.get("apiVersion") != API_VERSION or params.get("kind") != KIND:
        raise ConfigError(
            f"{where}: unsupported apiVersion/kind {params.get('apiVersion')!r}/"
            f"{params.get('kind')!r} (this driver understands {API_VERSION} {KIND}, and "
            f"{nvidia_config.API_VERSION} {' and '.join(nvidia_config.KINDS)})"
        )
    return None, _decoded(params, where)


def decode(entry: claims.OpaqueConfig, *, ref: claims.ClaimRef) -> GpuConfig:
    """Decode one opaque config entry; :class:`ConfigError` names the claim, entry and field."""
    return decode_for(entry, ref=ref)[1]


def recorded_sharing(raw: object) -> Sharing | None:
    """The ``sharing`` of a merged config as the checkpoint recorded it (:meth:`GpuConfig.to_json`);
    None when it does not decode."""
    from dra_driver.driver import configmodels  # pydantic: only for a config to decode

    found = configmodels.sharing(raw)
    return _plain(found) if found is not None else None


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
            sharing=cfg.sharing if cfg.sharing is not None else merged.sharing,
            env={**merged.env, **cfg.env},
        )
    return merged


def _decoded(params: Mapping[str, Any], where: str) -> GpuConfig:
    """``params`` decoded strictly (:class:`ConfigError` naming ``where`` and every field)."""
    from dra_driver.driver import configmodels  # pydantic: only for a config to decode

    try:
        model = configmodels.gpu_config(params)
    except configmodels.Invalid as exc:
        raise ConfigError(f"{where}: {exc}") from None
    found = model.sharing
    return GpuConfig(sharing=_plain(found) if found is not None else None, env=dict(model.env))


def _plain(model: configmodels.Sharing) -> Sharing:
    slicing, mps = model.time_slicing, model.mps
    return Sharing(
        strategy=model.strategy,
        time_slicing=TimeSlicing(slicing.interval) if slicing is not None else None,
        mps=(
            Mps(
                active_thread_percentage=mps.active_thread_percentage,
                pinned_device_memory_limit=mps.pinned_device_memory_limit,
                per_device_pinned_memory_limits=(
                    dict(mps.per_device_pinned_memory_limits)
                    if mps.per_device_pinned_memory_limits is not None
                    else None
                ),
            )
            if mps is not None
            else None
        ),
    )


_KIND_WORDS = {"gpu": "full GPUs", "mig": "MIG devices"}
