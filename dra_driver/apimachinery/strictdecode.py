"""The API server's strict JSON decoding of ``resource.k8s.io/v1`` objects, and what it yields.

Why it exists: the server decodes every write with ``fieldValidation=Strict`` semantics: an
unknown field, a value of the wrong JSON type, a quantity that does not parse or a time that is
not RFC 3339 is a 400 *before* any validation runs, and validation then sees the decoded object
(nulls as zero values, quantities as strings), which the server stores without empty lists and
maps. The in-memory API and the local slice validator need that same gate and those same forms;
this module walks a JSON value against the field layout of :mod:`.schema` to give them:
:func:`decode_errors`, :func:`decoded` and :func:`storage_form`.
"""

from __future__ import annotations

from typing import Any

from dra_driver.apimachinery import fielderrors, quantity, rfc3339, schema

_INT64 = (-(2**63), 2**63 - 1)
# Go's ParseQuantity error for anything that is not a quantity (empty included).
_QUANTITY_FORMAT = (
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
)


def decode_errors(kind: str, obj: Any) -> list[fielderrors.FieldError]:
    """Why the server refuses to decode ``obj`` as ``kind`` (HTTP 400), or ``[]``.

    Mirrors the apiserver's strict JSON decoding (sigs.k8s.io/json into the typed v1 struct,
    then the strict pass): a value whose JSON type does not fit the Go field
    (``json: cannot unmarshal ...``), a quantity that does not parse, or a time that is not
    RFC 3339 fails the decode on its own, and only then are unknown fields reported, all of
    them (``strict decoding error: unknown field "..."``).
    """
    if not isinstance(obj, dict):
        return [fielderrors.decode("", f"expected a JSON object for {kind}")]
    walk = _Decode()
    walk.value(obj, kind)
    if walk.fatal is not None:
        return [walk.fatal]
    if walk.mismatch is not None:
        return [walk.mismatch]
    return walk.unknown


class _Decode:
    """One pass over a JSON value against a :data:`~.schema.TYPES` layout, like Go's decoder: an
    ``UnmarshalJSON`` error (quantity, time) aborts, the first type mismatch is kept while
    decoding goes on, and unknown fields are collected for the strict pass."""

    def __init__(self) -> None:
        self.fatal: fielderrors.FieldError | None = None
        self.mismatch: fielderrors.FieldError | None = None
        self.unknown: list[fielderrors.FieldError] = []

    def value(
        self, value: Any, typ: str, path: str = "", gopath: str = "", struct: str = ""
    ) -> None:
        """``path`` names the field for us (``spec.devices[0].name``), ``gopath`` the way Go's
        error context does (``spec.devices.name``, no indices or keys), ``struct`` is the Go
        struct holding the field."""
        if value is None or self.fatal is not None:
            return  # JSON null decodes to the zero value everywhere
        if typ.startswith("["):
            if not isinstance(value, list):
                return self._mismatch(value, typ, path, gopath, struct)
            for i, item in enumerate(value):
                self.value(item, typ[1:-1], f"{path}[{i}]", gopath, struct)
        elif typ.startswith("{"):
            if not isinstance(value, dict):
                return self._mismatch(value, typ, path, gopath, struct)
            for key, item in value.items():
                self.value(item, typ[1:-1], f"{path}[{key}]", gopath, struct)
        elif typ in schema.TYPES:
            if not isinstance(value, dict):
                return self._mismatch(value, typ, path, gopath, struct)
            fields = schema.TYPES[typ]
            for key, item in value.items():
                sub, gosub = _join(path, key), _join(gopath, key)
                if key not in fields:
                    self.unknown.append(fielderrors.decode(sub, f'unknown field "{sub}"'))
                else:
                    self.value(item, fields[key], sub, gosub, typ)
        else:
            self._scalar(value, typ, path, gopath, struct)
        return None

    def _scalar(self, value: Any, typ: str, path: str, gopath: str, struct: str) -> None:
        if typ == "json":
            return
        if typ == "quantity":
            # resource.Quantity.UnmarshalJSON takes any JSON value: a string (trimmed) or a
            # bare number parses; anything else reaches ParseQuantity as text and fails.
            text = _quantity_text(value)
            try:
                if not text:
                    raise quantity.QuantityError(_QUANTITY_FORMAT)
                quantity.parse_quantity(text)
            except quantity.QuantityError as exc:
                reason = str(exc).removeprefix(f"quantity {text!r}: ")
                self.fatal = fielderrors.decode(path, f"{reason} (at {path}: {value!r})")
            return
        if typ == "time":
            # metav1.Time.UnmarshalJSON: a JSON string, then time.Parse(time.RFC3339, ...).
            if not isinstance(value, str):
                got = _json_kind(value)
                self.fatal = fielderrors.decode(
                    path, f"json: cannot unmarshal {got} into Go value of type string"
                )
            elif rfc3339.time_instant(value) is None:
                self.fatal = fielderrors.decode(
                    path, f'parsing time "{value}" as "{rfc3339.LAYOUT}": not RFC 3339 ({path})'
                )
            return
        if typ == "bool":
            ok = isinstance(value, bool)
        elif typ == "int":
            # Go decodes a JSON number into int64 with strconv.ParseInt: no fraction, no
            # exponent (those arrive here as floats), nothing outside int64.
            ok = isinstance(value, int) and not isinstance(value, bool)
            ok = ok and _INT64[0] <= value <= _INT64[1]
        else:
            ok = isinstance(value, str)
        if not ok:
            self._mismatch(value, typ, path, gopath, struct)

    def _mismatch(self, value: Any, typ: str, path: str, gopath: str, struct: str) -> None:
        if self.mismatch is None:
            got = _json_kind(value)
            if typ == "int" and isinstance(value, int | float) and not isinstance(value, bool):
                got = f"number {value}"
            self.mismatch = fielderrors.decode(
                path,
                f"json: cannot unmarshal {got} into Go struct field {struct}.{gopath} "
                f"of type {_go_type(typ)}",
            )


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _go_type(typ: str) -> str:
    """The Go type of a field in Go's notation (``[]v1.Device``, ``map[string]v1.Counter``)."""
    if typ.startswith("["):
        return "[]" + _go_type(typ[1:-1])
    if typ.startswith("{"):
        return "map[string]" + _go_type(typ[1:-1])
    return {"string": "string", "int": "int64", "bool": "bool"}.get(typ, f"v1.{typ}")


def _quantity_text(value: Any) -> str | None:
    """What Quantity.UnmarshalJSON hands to ParseQuantity: the string without its quotes,
    trimmed, or the JSON text of a number; None for values that can never parse."""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    return None


def decoded(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` as the server's validation sees it after decoding: JSON nulls are the zero value
    (an absent field, or ``{}``/``""``/``0``/``false`` inside lists and maps) and quantities
    written as numbers are strings. Empty lists stay: ``ints: []`` is not ``ints: null``.
    ``obj`` must have passed :func:`decode_errors`."""
    out: dict[str, Any] = _zeroed(obj, kind)
    return out


def _zero(typ: str) -> Any:
    """The zero value of a list item or map value (structs, strings, ints, bools, quantities:
    no list holds lists or maps, and no list or map holds times)."""
    return (
        {} if typ in schema.TYPES else {"string": "", "int": 0, "bool": False, "quantity": "0"}[typ]
    )


def _zeroed(value: Any, typ: str) -> Any:
    """``value`` decoded as ``typ``; free-form JSON (never null here: null struct fields are
    dropped before their value is looked at) passes through the last line unchanged."""
    if value is None:
        return _zero(typ)
    if typ.startswith("["):
        return [_zeroed(v, typ[1:-1]) for v in value]
    if typ.startswith("{"):
        return {k: _zeroed(v, typ[1:-1]) for k, v in value.items()}
    if typ in schema.TYPES:
        fields = schema.TYPES[typ]
        return {k: _zeroed(v, fields[k]) for k, v in value.items() if v is not None}
    if typ == "quantity" and not isinstance(value, str):
        return _quantity_text(value)
    if typ == "quantity":
        return value.strip()
    return value


def storage_form(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` as the server stores and returns it: empty lists and maps and nulls dropped
    (Go's ``omitempty``), except inside free-form JSON fields such as opaque parameters."""
    pruned: dict[str, Any] = _prune(_zeroed(obj, kind), kind)
    return pruned


def _prune(value: Any, typ: str) -> Any:
    if typ == "json":
        return value
    if isinstance(value, list):
        return [_prune(v, typ[1:-1]) for v in value]
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    for key, item in value.items():
        sub = typ[1:-1] if typ.startswith("{") else schema.TYPES[typ][key]
        item = _prune(item, sub)
        if isinstance(item, list | dict) and not item and sub != "json":
            continue
        out[key] = item
    return out
