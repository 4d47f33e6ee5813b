"""The CEL environment DRA selectors are compiled in: the ``device`` variable and the Kubernetes
``quantity()``/``semver()`` libraries, built on the cel-expr-python (cel-cpp) runtime.

Why it exists: cel-expr-python ships the CEL language and its standard extensions but none of
the Kubernetes additions. It can only carry custom values as protobuf messages, so this module
declares a tiny private descriptor pool (``kubernetes.DRADevice``, ``kubernetes.Quantity``,
``kubernetes.Semver``) and implements the Kubernetes member functions in Python on top of
:mod:`.quantity` and :mod:`.semver`. Two environments are built from it:

* the *check* environment types ``device`` as a message, so ``device.gpu`` and a selector whose
  result is statically a string fail at compile time, as in the API server;
* the *run* environment types ``device`` as ``map(string, dyn)`` so each device can be passed as
  plain Python dicts (cel-expr-python cannot take dicts for message-typed variables).

Quantity and Semver messages hold one canonical string, so CEL ``==`` between two of them is
semantic equality (``quantity("1Gi") == quantity("1024Mi")``), as in Kubernetes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from cel_expr_python import cel
from cel_expr_python.ext import ext_bindings, ext_math, ext_optional, ext_strings
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, struct_pb2

from dra_driver.apimachinery import quantity as qty
from dra_driver.apimachinery import semver as sv

PACKAGE = "kubernetes"
DEVICE_TYPE = f"{PACKAGE}.DRADevice"
QUANTITY_TYPE = f"{PACKAGE}.Quantity"
SEMVER_TYPE = f"{PACKAGE}.Semver"

_F = descriptor_pb2.FieldDescriptorProto


def _build_pool() -> descriptor_pool.DescriptorPool:
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(struct_pb2.DESCRIPTOR.serialized_pb)
    fd = descriptor_pb2.FileDescriptorProto(
        name="dra_driver/allocation/cel_types.proto",
        package=PACKAGE,
        syntax="proto3",
        dependency=["google/protobuf/struct.proto"],
    )
    scalar = _F.LABEL_OPTIONAL
    fd.message_type.add(name="Quantity").field.add(
        name="nanos", number=1, type=_F.TYPE_STRING, label=scalar
    )
    fd.message_type.add(name="Semver").field.add(
        name="canonical", number=1, type=_F.TYPE_STRING, label=scalar
    )
    device = fd.message_type.add(name="DRADevice")
    device.field.add(name="driver", number=1, type=_F.TYPE_STRING, label=scalar)
    device.field.add(name="allowMultipleAllocations", number=2, type=_F.TYPE_BOOL, label=scalar)
    # map<string, google.protobuf.Struct>: CEL sees map(string, map(string, dyn)).
    for number, (field, entry) in enumerate(
        (("attributes", "AttributesEntry"), ("capacity", "CapacityEntry")), start=3
    ):
        nested = device.nested_type.add(name=entry)
        nested.options.map_entry = True
        nested.field.add(name="key", number=1, type=_F.TYPE_STRING, label=scalar)
        nested.field.add(
            name="value",
            number=2,
            type=_F.TYPE_MESSAGE,
            type_name=".google.protobuf.Struct",
            label=scalar,
        )
        device.field.add(
            name=field,
            number=number,
            type=_F.TYPE_MESSAGE,
            type_name=f".{DEVICE_TYPE}.{entry}",
            label=_F.LABEL_REPEATED,
        )
    pool.Add(fd)
    return pool


_POOL = _build_pool()
_QuantityMsg: Any = message_factory.GetMessageClass(_POOL.FindMessageTypeByName(QUANTITY_TYPE))
_SemverMsg: Any = message_factory.GetMessageClass(_POOL.FindMessageTypeByName(SEMVER_TYPE))


# --- conversions between our value types and the CEL messages -------------------------------


def quantity_message(value: qty.Quantity) -> Any:
    """The CEL value for a quantity."""
    return _QuantityMsg(nanos=str(value.nanos))


def semver_message(value: sv.Semver) -> Any:
    """The CEL value for a semantic version (build metadata dropped: it never compares)."""
    return _SemverMsg(canonical=value.canonical())


def _q(message: Any) -> qty.Quantity:
    if not isinstance(message, _QuantityMsg):
        raise TypeError(f"no matching overload: expected a quantity, got {_kind(message)}")
    return qty.Quantity(int(message.nanos))


def _s(message: Any) -> sv.Semver:
    if not isinstance(message, _SemverMsg):
        raise TypeError(f"no matching overload: expected a semver, got {_kind(message)}")
    return sv.parse_semver(message.canonical)


def _kind(value: Any) -> str:
    if isinstance(value, _QuantityMsg):
        return QUANTITY_TYPE
    if isinstance(value, _SemverMsg):
        return SEMVER_TYPE
    return type(value).__name__


@functools.lru_cache(maxsize=4096)
def _quantity_literal(text: str) -> Any:
    return quantity_message(qty.parse_quantity(text))


@functools.lru_cache(maxsize=1024)
def _semver_literal(text: str, normalize: bool) -> Any:
    return semver_message(sv.parse_semver(text, normalize=normalize))


# --- the Kubernetes quantity and semver libraries -------------------------------------------

_T = cel.Type
_QT = cel.Type(QUANTITY_TYPE)
_ST = cel.Type(SEMVER_TYPE)


def _overload(
    overload_id: str,
    ret: Any,
    params: list[Any],
    impl: Callable[..., Any],
    *,
    member: bool = True,
) -> Any:
    return cel.Overload(
        overload_id, return_type=ret, parameters=params, is_member=member, impl=impl
    )


def _compare_q(a: Any, b: Any) -> int:
    return _q(a).compare(_q(b))


def _compare_s(a: Any, b: Any) -> int:
    return _s(a).compare(_s(b))


def _compare_any(a: Any, b: Any) -> int:
    if isinstance(a, _QuantityMsg) and isinstance(b, _QuantityMsg):
        return _compare_q(a, b)
    if isinstance(a, _SemverMsg) and isinstance(b, _SemverMsg):
        return _compare_s(a, b)
    raise TypeError(f"no matching overload: cannot compare {_kind(a)} with {_kind(b)}")


def _sign(a: Any) -> int:
    return _q(a).sign()


def _comparisons(*, runtime: bool) -> dict[str, list[Any]]:
    """compareTo/isGreaterThan/isLessThan on quantities and on semvers.

    cel-cpp's runtime registry tells message types apart only as "a message" (and does not
    dispatch message operands to ``dyn`` overloads), so the run environment, which compiles
    without type checks, gets one message-typed overload per name that dispatches on the
    Python message class; the check environment keeps the typed pairs so wrong operand types
    fail at compile time.
    """
    tests: dict[str, tuple[Any, Callable[[int], Any]]] = {
        "compareTo": (_T.INT, lambda c: c),
        "isGreaterThan": (_T.BOOL, lambda c: c > 0),
        "isLessThan": (_T.BOOL, lambda c: c < 0),
    }
    ids = {
        "compareTo": "compare_to",
        "isGreaterThan": "is_greater_than",
        "isLessThan": "is_less_than",
    }
    result: dict[str, list[Any]] = {}
    for name, (ret, out) in tests.items():
        if runtime:
            impl: Callable[[Any, Any], Any] = functools.partial(_apply, _compare_any, out)
            result[name] = [_overload(f"message_{ids[name]}", ret, [_QT, _QT], impl)]
        else:
            q_impl = functools.partial(_apply, _compare_q, out)
            s_impl = functools.partial(_apply, _compare_s, out)
            result[name] = [
                _overload(f"quantity_{ids[name]}", ret, [_QT, _QT], q_impl),
                _overload(f"semver_{ids[name]}", ret, [_ST, _ST], s_impl),
            ]
    return result


def _apply(compare: Callable[[Any, Any], int], out: Callable[[int], Any], a: Any, b: Any) -> Any:
    return out(compare(a, b))


def _function_decls(*, runtime: bool) -> list[Any]:
    int_t, bool_t, str_t = _T.INT, _T.BOOL, _T.STRING
    overloads: dict[str, list[Any]] = {
        "quantity": [
            _overload("string_to_quantity", _QT, [str_t], _quantity_literal, member=False)
        ],
        "isQuantity": [
            _overload("is_quantity_string", bool_t, [str_t], qty.is_quantity, member=False)
        ],
        # Kubernetes declares sign() as a global function; the member form is accepted too.
        "sign": [
            _overload("quantity_sign", int_t, [_QT], _sign, member=False),
            _overload("quantity_sign_member", int_t, [_QT], _sign),
        ],
        **_comparisons(runtime=runtime),
        "asApproximateFloat": [
            _overload(
                "quantity_get_float", _T.DOUBLE, [_QT], lambda a: _q(a).as_approximate_float()
            )
        ],
        "asInteger": [_overload("quantity_get_int", int_t, [_QT], lambda a: _q(a).as_integer())],
        "isInteger": [
            _overload("quantity_is_integer", bool_t, [_QT], lambda a: _q(a).is_integer())
        ],
        "add": [
            _overload(
                "quantity_add",
                _QT,
                [_QT, _QT],
                lambda a, b: quantity_message(_q(a).add(_q(b))),
            ),
            _overload(
                "quantity_add_int",
                _QT,
                [_QT, int_t],
                lambda a, b: quantity_message(_q(a).add(qty.Quantity.from_int(b))),
            ),
        ],
        "sub": [
            _overload(
                "quantity_sub",
                _QT,
                [_QT, _QT],
                lambda a, b: quantity_message(_q(a).sub(_q(b))),
            ),
            _overload(
                "quantity_sub_int",
                _QT,
                [_QT, int_t],
                lambda a, b: quantity_message(_q(a).sub(qty.Quantity.from_int(b))),
            ),
        ],
        "semver": [
            _overload(
                "string_to_semver", _ST, [str_t], lambda s: _semver_literal(s, False), member=False
            ),
            _overload("string_bool_to_semver", _ST, [str_t, bool_t], _semver_literal, member=False),
        ],
        "isSemver": [
            _overload("is_semver_string", bool_t, [str_t], sv.is_semver, member=False),
            _overload(
                "is_semver_string_bool",
                bool_t,
                [str_t, bool_t],
                lambda s, n: sv.is_semver(s, normalize=n),
                member=False,
            ),
        ],
        "major": [_overload("semver_major", int_t, [_ST], lambda a: _s(a).major)],
        "minor": [_overload("semver_minor", int_t, [_ST], lambda a: _s(a).minor)],
        "patch": [_overload("semver_patch", int_t, [_ST], lambda a: _s(a).patch)],
    }
    return [cel.FunctionDecl(name, decls) for name, decls in overloads.items()]


def _extensions() -> list[Any]:
    return [
        ext_bindings.ExtBindings(),
        ext_optional.ExtOptional(),
        ext_strings.ExtStrings(),
        ext_math.ExtMath(),
    ]


@functools.cache
def check_env() -> Any:
    """Environment with ``device`` typed as ``kubernetes.DRADevice`` (for compile errors)."""
    return cel.NewEnv(
        _POOL,
        variables={"device": cel.Type(DEVICE_TYPE)},
        functions=_function_decls(runtime=False),
        extensions=_extensions(),
    )


@functools.cache
def run_env() -> Any:
    """Environment with ``device`` as ``map(string, dyn)`` (for evaluation on plain dicts)."""
    return cel.NewEnv(
        _POOL,
        variables={"device": cel.Type.Map(cel.Type.STRING, cel.Type.DYN)},
        functions=_function_decls(runtime=True),
        extensions=_extensions(),
    )
