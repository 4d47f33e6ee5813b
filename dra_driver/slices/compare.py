"""How the publisher decides whether a ResourceSlice on the server equals the desired one.

Why it exists: "zero writes when nothing changed" depends on comparing what we want with what
the server stores, and the server stores more than we sent (uid, resourceVersion, taint
``timeAdded``, other clients' labels) and may spell quantities differently ("1024Mi" vs "1Gi").
These pure functions define equality for the publisher: spec content without the pool
generation, quantities by value, metadata only where we set it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from dra_driver.apimachinery import quantity
from dra_driver.kube import api


def carry_server_fields(obj: api.Obj, current: api.Obj | None) -> None:
    """Keep what the server or other clients filled in (taint ``timeAdded``, labels and
    annotations we do not set) so it is neither seen as a change nor overwritten."""
    if current is None:
        return
    meta, theirs = obj["metadata"], current.get("metadata") or {}
    for field in ("labels", "annotations"):
        merged = {**(theirs.get(field) or {}), **(meta.get(field) or {})}
        if merged:
            meta[field] = merged
    times = {
        (d.get("name"), t.get("key"), t.get("effect")): t.get("timeAdded")
        for d in (current.get("spec") or {}).get("devices") or ()
        for t in d.get("taints") or ()
    }
    for device in obj["spec"].get("devices") or ():
        for taint in device.get("taints") or ():
            if not taint.get("timeAdded"):
                found = times.get((device.get("name"), taint.get("key"), taint.get("effect")))
                if found:
                    taint["timeAdded"] = found


def content(obj: api.Obj) -> Any:
    """The spec without the pool generation, quantities compared by value (a new structure:
    :func:`_canonical` copies as it goes, so no deep copy first)."""
    spec = _canonical(obj.get("spec") or {})
    pool = spec.get("pool")
    if isinstance(pool, dict):
        pool.pop("generation", None)
    return spec


def content_key(slices: Mapping[str, api.Obj]) -> str:
    """One string for the content of a set of slices by name (equal content, equal key)."""
    return json.dumps([[n, content(obj)] for n, obj in sorted(slices.items())], sort_keys=True)


def in_place(
    wanted: Mapping[str, api.Obj],
    actual: Mapping[str, api.Obj],
    mine: Mapping[str, Any] | None = None,
    theirs: Mapping[str, Any] | None = None,
) -> str | None:
    """The one slice to update *at the pool's current generation*, or None when the change
    needs a new generation (every slice rewritten).

    A pool of several slices is rewritten slice by slice; with a new generation the scheduler
    sees it incomplete (no device of the node usable) until the last write lands. A change
    confined to one slice — the same slices, one generation on the server, one slice's content
    different, with the same devices in the same order and the same counter sets (a re-rank
    or a taint) — is complete at every instant: the scheduler reads the pool at the highest
    generation, all slices present, with either the old or the new content of that slice, and
    no device is in two slices or in none. A pool of one slice always gets a new generation
    (it costs the same one write). ``mine`` / ``theirs``: the slices' :func:`content`, when
    the caller has it already."""
    if len(wanted) < 2 or set(wanted) != set(actual):
        return None
    generations = {
        int(((s.get("spec") or {}).get("pool") or {}).get("generation") or 0)
        for s in actual.values()
    }
    if len(generations) != 1:
        return None
    ours = mine if mine is not None else {n: content(s) for n, s in wanted.items()}
    stored = theirs if theirs is not None else {n: content(s) for n, s in actual.items()}
    changed = [n for n in sorted(wanted) if ours[n] != stored[n]]
    if len(changed) != 1:
        return None
    new, old = wanted[changed[0]].get("spec") or {}, actual[changed[0]].get("spec") or {}
    if [d.get("name") for d in new.get("devices") or ()] != [
        d.get("name") for d in old.get("devices") or ()
    ]:
        return None
    if _canonical(new.get("sharedCounters") or []) != _canonical(old.get("sharedCounters") or []):
        return None
    return changed[0]


def _canonical(value: Any, key: str = "") -> Any:
    if isinstance(value, dict):  # empty and null fields are what the server leaves out
        return {k: _canonical(v, k) for k, v in value.items() if v not in (None, [], {})}
    if isinstance(value, list):
        return [_canonical(v, key) for v in value]
    if key == "value" and isinstance(value, str):
        try:
            return quantity.parse_quantity(value).nanos
        except quantity.QuantityError:
            return value
    return value


def pool(obj: api.Obj) -> Any:
    return (obj.get("spec") or {}).get("pool")


def meta(obj: api.Obj) -> Any:
    meta = obj.get("metadata") or {}
    return (
        {k: v for k, v in (meta.get("labels") or {}).items()},
        {k: v for k, v in (meta.get("annotations") or {}).items()},
        meta.get("ownerReferences") or [],
    )


def dropped(sent: api.Obj, stored: api.Obj) -> list[str]:
    """The spec fields ``sent`` has that ``stored`` (the server's answer to our write) lacks,
    as paths (``devices[3].taints``): what a server with a feature gate off dropped. Values
    are not compared (the server may spell them differently), only presence."""
    lost: list[str] = []
    _missing(_canonical(sent.get("spec") or {}), _canonical(stored.get("spec") or {}), "", lost)
    return lost


def _missing(sent: Any, stored: Any, path: str, lost: list[str]) -> None:
    if isinstance(sent, dict):
        if not isinstance(stored, dict):
            lost.append(path or ".")
            return
        for key, value in sent.items():
            where = f"{path}.{key}" if path else key
            if key not in stored:
                lost.append(where)
            else:
                _missing(value, stored[key], where, lost)
    elif isinstance(sent, list) and isinstance(stored, list):
        for i, (mine, theirs) in enumerate(zip(sent, stored, strict=False)):
            _missing(mine, theirs, f"{path}[{i}]", lost)
        if len(stored) < len(sent):
            lost.append(f"{path}[{len(stored)}:]")
