"""Which GPUs are published as shareable, and the consumable capacity a share of one takes.

Why it exists: sharing one GPU among claims is DRA's *consumable capacity* (KEP-5075): a device
with ``allowMultipleAllocations: true`` can be allocated to many claims, each consuming part of
its capacities, and the scheduler does the bookkeeping. The slice builder, the kubelet plugin
(which turns a share's consumed capacity into MPS limits) and the simulator must agree on the
capacities and their ``requestPolicy``; they all read them here.

A shareable GPU publishes, besides its usual attributes:

* ``memory``: the GPU's memory. Requests are rounded up to whole GiB (``validRange`` min 1Gi,
  step 1Gi, up to the GPU's memory in whole GiB); a claim that asks for no memory gets all of it
  (``default`` = the maximum), so a plain claim still gets the GPU to itself.
* ``computeShare``: percent of the GPU's streaming multiprocessors a share may use (MPS active
  thread percentage). Requests are whole percents from 0 to 100; the default, 0, means "no cap":
  the share competes for all SMs, and caps of the other shares still add up to at most 100.

Which GPUs: ``--shareable none`` (default: exclusive GPUs as before), ``all``, or a regular
expression searched in the product name (``H100``, ``A100|H100``). MIG devices are never made
shareable (their capacities are a fixed partition already; use MPS through opaque config there).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from dra_driver import records
from dra_driver.apimachinery import quantity
from dra_driver.devices import model

MEMORY: Final = "memory"
COMPUTE: Final = "computeShare"
GIB: Final = 1 << 30
MIN_SHARE_BYTES: Final = GIB
COMPUTE_FULL: Final = 100


class ShareableError(ValueError):
    """A ``--shareable`` value that is neither none, all nor a valid regular expression (alone
    or after ``auto:``)."""


AUTO_PREFIX = "auto:"  # ``auto:<selection>``: on where the API server keeps the fields, else off


@records.record
class Shareable:
    """Which GPUs to publish as shareable: none, all, or those whose product name matches.
    ``auto`` (written ``auto:<all|regex>``): only where the API server keeps consumable
    capacity; where it drops it the selection is off instead of refused
    (:func:`dra_driver.slices.serverfeatures.resolve`)."""

    spec: str = "none"
    auto: bool = False

    @classmethod
    def parse(cls, text: str | None) -> Shareable:
        spec = (text or "none").strip() or "none"
        auto = spec[: len(AUTO_PREFIX)].lower() == AUTO_PREFIX
        if auto:
            spec = spec[len(AUTO_PREFIX) :].strip()
            if spec in ("", "none"):
                raise ShareableError(
                    f"--shareable {text!r}: auto: needs all or a regular expression over the "
                    "GPU product name after it, e.g. auto:all"
                )
        elif spec.lower() == "auto":
            raise ShareableError(
                "--shareable 'auto': say which GPUs, e.g. auto:all or auto:H100 (on where the "
                "API server keeps consumable capacity, off where it drops it)"
            )
        if spec not in ("none", "all"):
            try:
                re.compile(spec)
            except re.error as exc:
                raise ShareableError(
                    f"--shareable {(text or '').strip()!r}: not none, all or a valid regular "
                    f"expression ({exc})"
                ) from None
        return cls(spec, auto=auto)

    def matches(self, gpu: model.Gpu) -> bool:
        if self.spec == "none" or gpu.mig_enabled:
            return False
        return self.spec == "all" or re.search(self.spec, gpu.product_name) is not None

    def __str__(self) -> str:
        """As the flag is written (``auto:all``, ``H100``); parses back to the same value."""
        return f"{AUTO_PREFIX}{self.spec}" if self.auto else self.spec


NONE = Shareable()


def max_share_bytes(memory_bytes: int) -> int:
    """The largest memory a share can take: the GPU's memory in whole GiB."""
    return memory_bytes // GIB * GIB


def capacity(memory_bytes: int, *, memory_text: str) -> dict[str, Any] | None:
    """The ``capacity`` map of a shareable GPU; None when it is too small to share (< 2Gi)."""
    top = max_share_bytes(memory_bytes)
    if top < 2 * GIB:
        return None
    top_text = f"{top // GIB}Gi"
    return {
        COMPUTE: {
            "value": str(COMPUTE_FULL),
            "requestPolicy": {
                "default": "0",
                "validRange": {"min": "0", "max": str(COMPUTE_FULL), "step": "1"},
            },
        },
        MEMORY: {
            "value": memory_text,
            "requestPolicy": {
                "default": top_text,
                "validRange": {"min": "1Gi", "max": top_text, "step": "1Gi"},
            },
        },
    }


@records.record
class Share:
    """What one allocation result consumes of a shared GPU."""

    memory_bytes: int  # 0 when the result does not say (treated as the whole GPU)
    compute_percent: int  # 0 = no cap

    def whole_gpu(self, gpu_memory_bytes: int) -> bool:
        """Whether this share leaves nothing to anyone else (prepared like an exclusive GPU)."""
        memory_all = self.memory_bytes == 0 or self.memory_bytes >= max_share_bytes(
            gpu_memory_bytes
        )
        return memory_all and self.compute_percent in (0, COMPUTE_FULL)


def share_of(consumed: Mapping[str, str], *, driver: str) -> Share:
    """A result's ``consumedCapacity`` (names bare or in the driver's domain) as a :class:`Share`.

    Raises :class:`ValueError` naming the capacity whose value is not a whole quantity.
    """
    values: dict[str, int] = {}
    for name, text in consumed.items():
        bare = name.removeprefix(f"{driver}/")
        if bare not in (MEMORY, COMPUTE):
            continue
        try:
            parsed = quantity.parse_quantity(str(text))
        except quantity.QuantityError as exc:
            raise ValueError(
                f"consumedCapacity[{name}] {text!r} is not a quantity: {exc}"
            ) from None
        if not parsed.is_integer() or parsed.sign() < 0:
            raise ValueError(f"consumedCapacity[{name}] {text!r} is not a whole, positive amount")
        values[bare] = parsed.as_integer()
    compute = values.get(COMPUTE, 0)
    if compute > COMPUTE_FULL:
        raise ValueError(f"consumedCapacity[{COMPUTE}] {compute} is above {COMPUTE_FULL}")
    return Share(memory_bytes=values.get(MEMORY, 0), compute_percent=compute)
