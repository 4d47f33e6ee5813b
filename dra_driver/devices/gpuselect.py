"""The GPU-selection grammar the publishing flags share: ``none``, ``all``, a product regex, or
``auto:<all|regex>``.

Why it exists: ``--dynamic-mig``, ``--shareable`` and ``--passthrough`` each choose GPUs the same
way, and an operator must be able to write one selection for all three. ``auto:`` means "on
where the API server keeps the ResourceSlice fields this needs, off where it drops them"
(:mod:`dra_driver.slices.serverfeatures`); an explicit selection on such a server is refused at
start instead. This module parses and matches; each flag keeps its own record type
(:class:`dra_driver.devices.passthrough.Passthrough` is written on it).
"""

from __future__ import annotations

import re

from dra_driver import records
from dra_driver.devices import model

NONE = "none"
ALL = "all"
AUTO_PREFIX = "auto:"


class SelectionError(ValueError):
    """A flag value that is neither none, all nor a valid regular expression (alone or after
    ``auto:``); the message names the flag."""


@records.record
class GpuSelection:
    """Which GPUs a flag selects; ``auto``: only where the server keeps the needed fields."""

    spec: str = NONE
    auto: bool = False

    @classmethod
    def parse(cls, text: str | None, *, flag: str, needs: str) -> GpuSelection:
        """``needs`` says what ``auto:`` depends on, for the messages (e.g. "shared counters")."""
        value = (text or NONE).strip() or NONE
        auto = value[: len(AUTO_PREFIX)].lower() == AUTO_PREFIX
        if auto:
            value = value[len(AUTO_PREFIX) :].strip()
            if value.lower() in ("", NONE):
                raise SelectionError(
                    f"{flag} {text!r}: auto: needs all or a regular expression over the GPU "
                    "product name after it, e.g. auto:all"
                )
        elif value.lower() == "auto":
            raise SelectionError(
                f"{flag} 'auto': say which GPUs, e.g. auto:all or auto:H100 (on where the API "
                f"server keeps {needs}, off where it drops them)"
            )
        if value.lower() in (NONE, ALL):
            return cls(value.lower(), auto=auto)
        try:
            re.compile(value)
        except re.error as exc:
            raise SelectionError(
                f"{flag} {(text or '').strip()!r}: not none, all or a regular expression over "
                f"the GPU product name ({exc})"
            ) from None
        return cls(value, auto=auto)

    @property
    def text(self) -> str:
        """As the flag is written (``auto:all``, ``H100``); parses back to the same value."""
        return f"{AUTO_PREFIX}{self.spec}" if self.auto else self.spec

    @property
    def enabled(self) -> bool:
        return self.spec != NONE

    def wants(self, gpu: model.Gpu) -> bool:
        """Whether the operator asked for ``gpu`` (product name searched, any case)."""
        if self.spec == NONE:
            return False
        if self.spec == ALL:
            return True
        return re.search(self.spec, gpu.product_name, re.IGNORECASE) is not None
