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

No dependency on the rest of the driver. This module holds the API's names, limits and error
wording; its pydantic models and the translation are :mod:`dra_driver.driver.nvidiamodels`,
which :mod:`dra_driver.driver.config` imports only when a claim has such a config to decode (most
claims have none, and an agent that sees none never loads pydantic for them).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Final

from dra_driver.apimachinery import quantity

if TYPE_CHECKING:
    import pydantic_core

API_VERSION: Final = "resource.nvidia.com/v1beta1"
GPU_CONFIG: Final = "GpuConfig"
MIG_DEVICE_CONFIG: Final = "MigDeviceConfig"
KINDS: Final = (GPU_CONFIG, MIG_DEVICE_CONFIG)
INTERVALS: Final = ("Default", "Short", "Medium", "Long")
_MIB = 1 << 20
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


def describe(err: pydantic_core.ErrorDetails) -> str:
    """One pydantic error as ``field a.b: reason`` (shared with our own config's decoder)."""
    field = ".".join(str(part) for part in err["loc"]) or "(top level)"
    if err["type"] == "extra_forbidden":
        return f"field {field}: unknown field"
    if err["type"] == "missing":
        return f"field {field}: required field is missing"
    message = err["msg"].removeprefix("Value error, ")
    return f"field {field}: {message}"
