"""Compile DRA CEL selectors once and evaluate them against ResourceSlice devices.

Why it exists: DeviceClasses and ResourceClaim requests pick devices with CEL expressions over
one variable, ``device``. To reach the scheduler's verdicts locally (simulator, demo, tests on
recorded API-server verdicts) we must accept and reject the same expressions and evaluate them
with the same rules:

* ``device.driver`` (string), ``device.allowMultipleAllocations`` (bool),
  ``device.attributes[domain][id]`` and ``device.capacity[domain][id]``; names without a domain
  belong to the device's driver; ``version`` attributes are semver objects and capacities are
  quantities;
* an unknown domain is an empty map, but an unknown id is an evaluation *error* (the scheduler
  aborts rather than treating it as "no match"); ``has()`` and ``.?id.orValue()`` guard it;
* the result must be a bool: statically non-bool expressions do not compile, anything else
  that is not a bool at run time is an error.

Compiled selectors are cached by expression text. For many selectors on one device, convert
the device once with :func:`prepare_device` and call :meth:`CompiledSelector.evaluate`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Mapping
from typing import Any

from cel_expr_python import cel

from dra_driver import records
from dra_driver.allocation import cel_env
from dra_driver.apimachinery import quantity as qty
from dra_driver.apimachinery import semver as sv

# Upper bound on one selector's length in the resource.k8s.io API.
MAX_EXPRESSION_BYTES = 10 * 1024
# How many distinct unknown domains one evaluation may add (see ``_evaluate``).
_MAX_DOMAIN_RETRIES = 16
_STATUS_PREFIX = re.compile(r"^[A-Z_]+: ")
_STATUS_SUFFIX = re.compile(r" \[[A-Z_]+\]$")
_MISSING_KEY = re.compile(r"Key not found in map : ([\"'])(.*)\1$", re.DOTALL)


def _quote(text: str) -> str:
    """Quote like the API server's messages do (a JSON string)."""
    return json.dumps(text, ensure_ascii=False)


class CelError(Exception):
    """Base of the errors raised by this module."""


class CelCompileError(CelError):
    """A selector does not compile; the message names the expression and the reason."""

    def __init__(self, expression: str, reason: str) -> None:
        super().__init__(f"CEL expression {_quote(expression)}: {reason}")
        self.expression = expression
        self.reason = reason


class CelEvalError(CelError):
    """A selector could not be evaluated for a device (e.g. a missing attribute)."""

    def __init__(self, device: str, reason: str, expression: str | None = None) -> None:
        where = f"device {_quote(device)}"
        if expression is not None:
            where += f": CEL expression {_quote(expression)}"
        super().__init__(f"{where}: {reason}")
        self.device = device
        self.expression = expression
        self.reason = reason


@records.record
class CelDevice:
    """A device converted once into CEL values, ready for any number of selectors."""

    name: str
    driver: str
    attributes: Mapping[str, Mapping[str, Any]]
    capacity: Mapping[str, Mapping[str, Any]]
    allow_multiple_allocations: bool
    activation: Any = dataclasses.field(repr=False, compare=False)


def _split_name(name: str, driver: str) -> tuple[str, str]:
    domain, sep, ident = name.partition("/")
    return (domain, ident) if sep else (driver, name)


def _attribute_value(device: str, name: str, attr: Any) -> Any:
    if not isinstance(attr, Mapping):
        raise CelEvalError(device, f"attribute {name!r}: must be an object, not {attr!r}")
    # Same precedence as the Kubernetes converter: int, bool, string, version.
    if "int" in attr and isinstance(attr["int"], int) and not isinstance(attr["int"], bool):
        return attr["int"]
    if "bool" in attr and isinstance(attr["bool"], bool):
        return attr["bool"]
    if "string" in attr and isinstance(attr["string"], str):
        return attr["string"]
    if "version" in attr and isinstance(attr["version"], str):
        try:
            return cel_env.semver_message(sv.parse_semver(attr["version"]))
        except sv.SemverError as err:
            raise CelEvalError(
                device, f"attribute {name!r}: parse semantic version: {err}"
            ) from err
    raise CelEvalError(device, f"attribute {name!r}: unsupported attribute value {dict(attr)!r}")


def _capacity_value(device: str, name: str, cap: Any) -> Any:
    value = cap.get("value") if isinstance(cap, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise CelEvalError(device, f"capacity {name!r}: needs a quantity 'value', got {cap!r}")
    try:
        return cel_env.quantity_message(qty.parse_quantity(str(value)))
    except qty.QuantityError as err:
        raise CelEvalError(device, f"capacity {name!r}: {err}") from err


def prepare_device(device: Mapping[str, Any], *, driver: str) -> CelDevice:
    """Convert a ResourceSlice device (resource.k8s.io/v1 JSON form) of ``driver``'s slice.

    Raises :class:`CelEvalError` naming the device when an attribute or capacity value cannot
    be represented (a bad version or quantity, a list attribute): the scheduler treats such a
    device as an error for every selector.
    """
    name = str(device.get("name", "<unnamed>"))
    attributes: dict[str, dict[str, Any]] = {}
    for qualified, attr in (device.get("attributes") or {}).items():
        domain, ident = _split_name(str(qualified), driver)
        attributes.setdefault(domain, {})[ident] = _attribute_value(name, str(qualified), attr)
    capacity: dict[str, dict[str, Any]] = {}
    for qualified, cap in (device.get("capacity") or {}).items():
        domain, ident = _split_name(str(qualified), driver)
        capacity.setdefault(domain, {})[ident] = _capacity_value(name, str(qualified), cap)
    multi = bool(device.get("allowMultipleAllocations", False))
    data = _device_data(driver, multi, attributes, capacity)
    return CelDevice(
        name=name,
        driver=driver,
        attributes=attributes,
        capacity=capacity,
        allow_multiple_allocations=multi,
        activation=cel_env.run_env().Activation(data),
    )


def _device_data(
    driver: str,
    multi: bool,
    attributes: Mapping[str, Mapping[str, Any]],
    capacity: Mapping[str, Mapping[str, Any]],
) -> dict[str, Any]:
    return {
        "device": {
            "driver": driver,
            "allowMultipleAllocations": multi,
            "attributes": attributes,
            "capacity": capacity,
        }
    }


def _clean(message: str) -> str:
    """cel-cpp status text without its status-code decorations."""
    return _STATUS_SUFFIX.sub("", _STATUS_PREFIX.sub("", message.strip()))


def _type_name(type_: Any) -> str:
    """A CEL type in the spelling Kubernetes uses in its messages (``string``, ``list(int)``)."""
    text = str(type_.name())
    text = re.sub(r"\b[A-Z][A-Z_]*\b", lambda m: m.group(0).lower(), text)
    return text.replace("<", "(").replace(">", ")")


@records.record
class CompiledSelector:
    """One compiled selector expression; immutable and safe to share between threads."""

    expression: str
    _program: Any = dataclasses.field(repr=False, compare=False)

    def matches(self, device: Mapping[str, Any], driver: str) -> bool:
        """Evaluate against one ResourceSlice device dict of ``driver``'s slice."""
        return self.evaluate(prepare_device(device, driver=driver))

    def evaluate(self, device: CelDevice) -> bool:
        """Evaluate against a prepared device; raises :class:`CelEvalError` on any error."""
        result = self._run(device, device.activation)
        value = result.value()
        if isinstance(value, bool):  # fast path: error results carry a message string
            return value
        extra: dict[str, dict[str, Any]] = {}
        for _ in range(_MAX_DOMAIN_RETRIES):
            missing = self._unknown_domain(device, result, extra)
            if missing is None:
                break
            # Kubernetes gives an unknown domain an empty map; cel-cpp maps cannot default,
            # so add the domain that was looked up and evaluate again.
            extra[missing] = {}
            attributes = {**extra, **device.attributes}
            capacity = {**extra, **device.capacity}
            data = _device_data(
                device.driver, device.allow_multiple_allocations, attributes, capacity
            )
            result = self._run(device, cel_env.run_env().Activation(data))
        return self._to_bool(device, result)

    def _run(self, device: CelDevice, activation: Any) -> Any:
        try:
            return self._program.eval(activation)
        except RuntimeError as err:
            raise CelEvalError(device.name, _clean(str(err)), self.expression) from err

    @staticmethod
    def _unknown_domain(device: CelDevice, result: Any, extra: Mapping[str, Any]) -> str | None:
        if result.type() != cel.Type.ERROR:
            return None
        found = _MISSING_KEY.search(str(result.value()))
        if found is None:
            return None
        key = found.group(2)
        known = key in extra or (key in device.attributes and key in device.capacity)
        return None if known else key

    def _to_bool(self, device: CelDevice, result: Any) -> bool:
        if result.type() == cel.Type.ERROR:
            message = _clean(str(result.value()))
            found = _MISSING_KEY.search(message)
            if found is not None:
                message = f"no such key: {found.group(2)}"
            raise CelEvalError(device.name, message, self.expression)
        value = result.value()
        if not isinstance(value, bool):
            raise CelEvalError(
                device.name,
                f"CEL result of type {_type_name(result.type())} could not be converted to bool",
                self.expression,
            )
        return value


def compile_selector(expression: str) -> CompiledSelector:
    """Compile a selector, cached by its text; raises :class:`CelCompileError`."""
    if not isinstance(expression, str):
        raise CelCompileError(repr(expression), "expression must be a string")
    result = _compile_cached(expression)
    if isinstance(result, CelCompileError):
        raise CelCompileError(result.expression, result.reason)
    return result


@functools.lru_cache(maxsize=1024)
def _compile_cached(expression: str) -> CompiledSelector | CelCompileError:
    try:
        return _compile(expression)
    except CelCompileError as err:
        return err.with_traceback(None)  # cached: keep no frames alive


def _compile(expression: str) -> CompiledSelector:
    if len(expression.encode()) > MAX_EXPRESSION_BYTES:
        raise CelCompileError(expression, f"must be at most {MAX_EXPRESSION_BYTES} bytes long")
    try:
        checked = cel_env.check_env().compile(expression)
    except RuntimeError as err:
        raise CelCompileError(expression, f"compilation failed: {_clean(str(err))}") from err
    output = checked.return_type()
    if output != cel.Type.BOOL and output != cel.Type.DYN:
        raise CelCompileError(
            expression, f"must evaluate to bool or the unknown type, not {_type_name(output)}"
        )
    try:
        program = cel_env.run_env().compile(expression, disable_check=True)
    except RuntimeError as err:  # should not happen once the check environment accepted it
        raise CelCompileError(expression, f"compilation failed: {_clean(str(err))}") from err
    return CompiledSelector(expression=expression, _program=program)
