"""What the API server does with a PATCH of a Node, for the in-memory API.

Why it exists: the node agents keep their Node's labels with JSON merge patches, and the fake
must answer those the way kube-apiserver does or the agents' tests prove nothing: RFC 7386
merge (``null`` deletes a key), the ``resourceVersion`` / ``uid`` preconditions a patch may
carry (409), a renamed object refused (400), values of the wrong JSON type refused on decoding
(400), label keys/values and annotation keys and total size validated (422, the server's
messages), server-owned metadata and the status (a subresource) left as they were, and a patch
that changes nothing stored as a no-op (no new ``resourceVersion``). Pure functions; the
bookkeeping (lock, counters, call log) is :mod:`dra_driver.testing.fakeapi.memstate`'s.
"""

from __future__ import annotations

import copy
from typing import Any

from dra_driver.apimachinery import fielderrors, names
from dra_driver.apimachinery.fielderrors import FieldError
from dra_driver.kube import api

# The server's limit on all annotations of one object together (keys plus values).
TOTAL_ANNOTATION_SIZE = 256 * 1024
_SERVER_OWNED = ("uid", "creationTimestamp", "generation", "resourceVersion", "managedFields")
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge key by key, ``null`` removes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def has_list(value: Any) -> bool:
    """Whether a patch holds a JSON array anywhere (strategic merge treats those differently)."""
    if isinstance(value, list):
        return True
    if isinstance(value, dict):
        return any(has_list(v) for v in value.values())
    return False


def conflict(name: str, detail: str) -> api.Conflict:
    return api.Conflict(f'Operation cannot be fulfilled on nodes "{name}": {detail}')


def apply(name: str, old: api.Obj, patch: Any) -> api.Obj:
    """The Node after ``patch``, or the error the server answers with (preconditions, decoding,
    validation). Server-owned metadata and the status keep their old values."""
    if not isinstance(patch, dict):
        raise api.Invalid("the patch must be a JSON object", status=400)
    old_meta = old["metadata"]
    meta_patch = patch.get("metadata")
    if isinstance(meta_patch, dict):
        rv, uid = meta_patch.get("resourceVersion"), meta_patch.get("uid")
        if uid and uid != old_meta.get("uid"):
            raise conflict(
                name,
                f"Precondition failed: UID in precondition: {uid}, "
                f"UID in object meta: {old_meta.get('uid')}",
            )
        if rv and rv != old_meta.get("resourceVersion"):
            raise conflict(
                name,
                "the object has been modified; please apply your changes to the latest version "
                "and try again",
            )
    new = merge_patch(old, patch)
    if not isinstance(new.get("metadata"), dict):
        raise api.Invalid(
            _decode_message(new.get("metadata"), "metadata", "ObjectMeta"), status=400
        )
    meta = new["metadata"]
    if meta.get("name") != name:
        raise api.Invalid(
            f"the name of the object ({meta.get('name')}) does not match the name on the URL "
            f"({name})",
            status=400,
        )
    for field in ("labels", "annotations"):
        _decode_string_map(meta, field)
    for field in _SERVER_OWNED:
        if field in old_meta:
            meta[field] = copy.deepcopy(old_meta[field])
        else:
            meta.pop(field, None)
    if "status" in old:
        new["status"] = copy.deepcopy(old["status"])
    else:
        new.pop("status", None)
    errors = validate_meta(meta)
    if errors:
        raise api.Invalid(f'Node "{name}" is invalid: {fielderrors.summary(errors)}')
    return dict(new)


def _json_type(value: Any) -> str:
    """The JSON type name Go's decoder reports (``number``, ``bool``, ``array``, ...)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, dict) else "string"


def _decode_message(value: Any, field: str, go_type: str) -> str:
    return (
        'Node in version "v1" cannot be handled as a Node: json: cannot unmarshal '
        f"{_json_type(value)} into Go struct field ObjectMeta.metadata.{field} of type {go_type}"
    )


def _decode_string_map(meta: dict[str, Any], field: str) -> None:
    value = meta.get(field)
    if value is None:
        meta.pop(field, None)
        return
    if not isinstance(value, dict):
        raise api.Invalid(_decode_message(value, field, "map[string]string"), status=400)
    for item in value.values():
        if not isinstance(item, str):
            raise api.Invalid(_decode_message(item, field, "string"), status=400)


def validate_meta(meta: dict[str, Any]) -> list[FieldError]:
    """Labels (keys and values) and annotations (keys, total size) as the server checks them."""
    errors: list[FieldError] = []
    for key, value in (meta.get("labels") or {}).items():
        errors += [
            fielderrors.invalid("metadata.labels", key, p) for p in names.qualified_name(key)
        ]
        errors += [
            fielderrors.invalid("metadata.labels", value, p) for p in names.label_value(value)
        ]
    annotations = meta.get("annotations") or {}
    for key in annotations:
        errors += [
            fielderrors.invalid("metadata.annotations", key, p)
            for p in names.qualified_name(key.lower())
        ]
    size = sum(len(k) + len(v) for k, v in annotations.items())
    if size > TOTAL_ANNOTATION_SIZE:
        errors.append(
            fielderrors.FieldError(
                "metadata.annotations",
                fielderrors.Kind.TOO_LONG,
                f"must have at most {TOTAL_ANNOTATION_SIZE} bytes",
            )
        )
    return errors
