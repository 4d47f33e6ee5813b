"""Field errors in the shape the Kubernetes API server reports them.

Why it exists: our local validators (ResourceSlices before publishing, claims and classes in the
in-memory API) must reject what the real server rejects *and say it the same way*: the same
field path (``spec.devices[0].attributes[driverVersion].version``) and the same kind of error
(``Invalid value``, ``Too many``, ...). Tests compare those paths with recorded server messages,
and operators get messages they can search for. Pure data and formatting, no client library.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from typing import Any

from dra_driver import records


class Kind(enum.StrEnum):
    """The error kinds of the server's field validation (their rendered names)."""

    INVALID = "Invalid value"
    REQUIRED = "Required value"
    DUPLICATE = "Duplicate value"
    TOO_MANY = "Too many"
    TOO_LONG = "Too long"
    NOT_SUPPORTED = "Unsupported value"
    FORBIDDEN = "Forbidden"
    # Not a field-validation kind: the object could not be decoded (HTTP 400, not 422).
    DECODE = "Decode error"


_OMIT = object()


class Rendered(str):
    """A value already in the server's rendering (a Go struct printed as JSON with its Go
    field names, e.g. ``{"IntValue":1,"BoolValue":null,...}``): shown as is, unquoted."""


@records.record
class FieldError:
    """One problem with one field; ``str()`` renders it like the server does."""

    path: str
    kind: Kind
    detail: str = ""
    value: Any = _OMIT
    device: str | None = None  # name of the device the error is about, for operators

    @property
    def status(self) -> int:
        """HTTP status the server answers with: 400 for undecodable objects, else 422."""
        return 400 if self.kind is Kind.DECODE else 422

    def __str__(self) -> str:
        text = f"{self.path}: {self.kind.value}"
        if self.kind is Kind.DECODE:
            text = self.detail
        elif self.value is not _OMIT:
            text += f": {render_value(self.value)}"
            if self.detail:
                text += f": {self.detail}"
        elif self.detail:
            text += f": {self.detail}"
        if self.device is not None and self.kind is not Kind.DECODE:
            text += f" (device {self.device!r})"
        return text


def render_value(value: Any) -> str:
    """Value the way the server quotes it: strings in double quotes, numbers bare, JSON else."""
    if isinstance(value, Rendered):
        return str(value)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def invalid(path: str, value: Any, detail: str, *, device: str | None = None) -> FieldError:
    return FieldError(path, Kind.INVALID, detail, value, device)


def required(path: str, detail: str = "", *, device: str | None = None) -> FieldError:
    return FieldError(path, Kind.REQUIRED, detail, device=device)


def duplicate(path: str, value: Any, *, device: str | None = None) -> FieldError:
    return FieldError(path, Kind.DUPLICATE, "", value, device)


def too_many(path: str, actual: int, limit: int, *, device: str | None = None) -> FieldError:
    return FieldError(path, Kind.TOO_MANY, f"must have at most {limit} items", actual, device)


def too_long(path: str, limit: int, *, device: str | None = None) -> FieldError:
    return FieldError(path, Kind.TOO_LONG, f"may not be more than {limit} bytes", device=device)


def not_supported(
    path: str, value: Any, supported: Sequence[str], *, device: str | None = None
) -> FieldError:
    listing = ", ".join(json.dumps(s) for s in sorted(supported))
    return FieldError(path, Kind.NOT_SUPPORTED, f"supported values: {listing}", value, device)


def forbidden(path: str, detail: str, *, device: str | None = None) -> FieldError:
    return FieldError(path, Kind.FORBIDDEN, detail, device=device)


def decode(path: str, detail: str) -> FieldError:
    """The object cannot be decoded (unknown field, wrong JSON type, bad quantity)."""
    return FieldError(path, Kind.DECODE, detail)


def summary(errors: Sequence[FieldError]) -> str:
    """All errors of one object as one line: ``err`` or ``[err1, err2]``."""
    if len(errors) == 1:
        return str(errors[0])
    return "[" + ", ".join(str(e) for e in errors) + "]"


def status_message(kind: str, name: str, errors: Sequence[FieldError]) -> tuple[int, str]:
    """HTTP status and the full Status message the server would send for ``errors``.

    ``kind`` is the object kind (``ResourceSlice``); decode errors win, as on the server,
    because the object is never validated when it cannot be decoded.
    """
    decoding = [e for e in errors if e.kind is Kind.DECODE]
    if decoding:
        unknown = [e for e in decoding if e.detail.startswith("unknown field")]
        if unknown and len(unknown) == len(decoding):
            body = "strict decoding error: " + ", ".join(e.detail for e in unknown)
        else:
            body = "; ".join(e.detail for e in decoding)
        return 400, f'{kind} in version "v1" cannot be handled as a {kind}: {body}'
    return 422, f'{kind}.resource.k8s.io "{name}" is invalid: {summary(errors)}'
