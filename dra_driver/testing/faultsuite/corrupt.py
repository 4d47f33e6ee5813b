"""Corrupted checkpoints: every way we know a claim file, the boot marker or a spec can be bad.

Each scenario prepares two plain claims and a time-sliced one (the *victim*), damages a file,
and starts the plugin core in a forked child (so a hang or a crash is seen as such). Start-up
must succeed; the plain claims must stay prepared; nothing may leak; every GPU's time-slice must
match the claims still prepared (a victim whose record is unreadable is gone, and its GPUs back
at their defaults); and a fresh claim, also on the victim's GPUs when the victim is gone, must
prepare and unprepare.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dra_driver import app, logs
from dra_driver.driver import atomicfile
from dra_driver.testing.faultsuite import Row, rig

START_DEADLINE_S = 30.0
Damage = Callable[[app.PluginSettings, str], None]


def _record(where: app.PluginSettings, uid: str) -> Path:
    return where.plugin_dir / "claims" / f"{uid}.json"


def _replace_with(data: bytes) -> Damage:
    def damage(where: app.PluginSettings, uid: str) -> None:
        _record(where, uid).write_bytes(data)

    return damage


def _edit(change: Callable[[dict[str, Any]], object]) -> Damage:
    def damage(where: app.PluginSettings, uid: str) -> None:
        path = _record(where, uid)
        record = json.loads(path.read_bytes())
        replaced = change(record)
        path.write_text(json.dumps(record if replaced is None else replaced))

    return damage


def _truncate(where: app.PluginSettings, uid: str) -> None:
    path = _record(where, uid)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _fifo(where: app.PluginSettings, uid: str) -> None:
    _fifo_at(_record(where, uid))


def _symlink(target: str) -> Damage:
    def damage(where: app.PluginSettings, uid: str) -> None:
        path = _record(where, uid)
        path.unlink()
        path.symlink_to(target)

    return damage


def _directory(where: app.PluginSettings, uid: str) -> None:
    path = _record(where, uid)
    path.unlink()
    path.mkdir()
    (path / "inner").write_text("x")


def _meta(data: bytes) -> Damage:
    def damage(where: app.PluginSettings, uid: str) -> None:
        (where.plugin_dir / "checkpoint.json").write_bytes(data)

    return damage


def _temporaries(where: app.PluginSettings, uid: str) -> None:
    (where.plugin_dir / "claims" / f"{atomicfile.TMP_PREFIX}{uid}.json.0a1b").write_text("{")
    prefix = f"{atomicfile.TMP_PREFIX}{rig.SPEC_PREFIX}"
    (where.cdi_root / f"{prefix}{uid}.json.0a1b").write_text("{")


def _orphan_spec(where: app.PluginSettings, uid: str) -> None:
    (where.cdi_root / f"{rig.SPEC_PREFIX}{'0' * 8}-0000-4000-8000-{'0' * 12}.json").write_text("{}")


def _spec(change: Callable[[Path], None]) -> Damage:
    def damage(where: app.PluginSettings, uid: str) -> None:
        change(where.cdi_root / f"{rig.SPEC_PREFIX}{uid}.json")

    return damage


def _write(path: Path, data: bytes) -> None:
    path.write_bytes(data)


def _fifo_at(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _started(record: dict[str, Any]) -> None:
    record["state"] = "PrepareStarted"


def _drop(key: str) -> Callable[[dict[str, Any]], None]:
    def change(record: dict[str, Any]) -> None:
        record.pop(key)

    return change


def _set(key: str, value: object) -> Callable[[dict[str, Any]], None]:
    def change(record: dict[str, Any]) -> None:
        record[key] = value

    return change


# name → (damage, does the victim stay prepared?, do the plain claims stay prepared?)
SCENARIOS: dict[str, tuple[Damage, bool, bool]] = {
    "truncated": (_truncate, False, True),
    "empty": (_replace_with(b""), False, True),
    "garbage": (_replace_with(bytes(range(256)) * 4), False, True),
    "not-utf8": (_replace_with(b'{"uid": "\xff\xfe"}'), False, True),
    "json-array": (_replace_with(b"[]"), False, True),
    "json-null": (_replace_with(b"null"), False, True),
    "newer-version": (_edit(_set("version", 2)), False, True),
    "unknown-field": (_edit(_set("surprise", True)), False, True),
    "missing-field": (_edit(_drop("cdiSpec")), False, True),
    "uid-mismatch": (_edit(_set("uid", "0c0c0c0c-0000-4000-8000-000000000000")), False, True),
    "other-boot": (_edit(_set("bootId", "an-earlier-boot")), False, True),
    "deep-list": (_replace_with(b"[" * 100_000), False, True),
    "deep-object": (_replace_with(b'{"a":' * 50_000), False, True),
    "huge": (_replace_with(b" " * (5 << 20)), False, True),
    "fifo": (_fifo, False, True),
    "symlink-dev-zero": (_symlink("/dev/zero"), False, True),
    "symlink-elsewhere": (_symlink("/etc/hostname"), False, True),
    "directory": (_directory, False, True),
    "interrupted": (_edit(_started), False, True),
    "meta-garbage": (_meta(b"\x00\x01garbage"), True, True),
    "meta-deep": (_meta(b"[" * 100_000), True, True),
    "meta-wrong-kind": (_meta(b'{"version":1,"kind":"Other","bootId":"boot-1"}'), True, True),
    "meta-other-boot": (
        _meta(b'{"version":1,"kind":"GpuDraClaimCheckpoint","bootId":"old"}'),
        False,
        False,
    ),
    "temporaries": (_temporaries, True, True),
    "orphan-spec": (_orphan_spec, True, True),
    "spec-missing": (_spec(Path.unlink), True, True),
    "spec-garbage": (_spec(lambda p: _write(p, b"\xff not a spec")), True, True),
    "spec-fifo": (_spec(lambda p: _fifo_at(p)), True, True),
}


def run(size: int, rng: random.Random, workdir: Path) -> Row:
    """Every scenario once, then ``size`` more drawn at random (in fresh directories)."""
    row = Row("corrupted checkpoints")
    names = list(SCENARIOS) + [rng.choice(list(SCENARIOS)) for _ in range(size)]
    for index, name in enumerate(names):
        row.trials += 1
        base = workdir / f"corrupt-{index}"
        try:
            _trial(name, base, row)
        finally:
            shutil.rmtree(base, ignore_errors=True)
    return row


def _trial(name: str, base: Path, row: Row) -> None:
    damage, victim_stays, plain_stay = SCENARIOS[name]
    where = rig.settings(base, serial=True)
    plain = [rig.claim("p0", ["gpu-0"]), rig.claim("p1", ["gpu-1", "gpu-2"])]
    victim = rig.claim("victim", ["gpu-6", "gpu-7"], interval="Long")
    fresh = [rig.claim("fresh", ["gpu-5"]), rig.claim("taker", ["gpu-6"])]
    api = rig.api_with([*plain, victim, *fresh])
    refs = [rig.ref_of(o) for o in (*plain, victim)]
    node = rig.devices()
    driver = app.build_driver(where, devices=node, api=api, log=logs.get("faults"))
    errors = [r.error for r in driver.prepare(refs).values() if r.error]
    driver.close()
    if errors:
        row.fail(f"{name}: set-up failed: {errors[0][:200]}")
        return
    damage(where, refs[-1].uid)
    outcome = _start_in_child(where, api, [rig.ref_of(o) for o in fresh], victim_stays)
    if outcome is not None:
        kind, note = outcome
        row.fail(f"{name}: {note}", crash=kind == "crash", hang=kind == "hang")
        return
    told = {r.uid: plain_stay for r in refs[:-1]} | {refs[-1].uid: victim_stays}
    found = rig.audit(where, told=told, node=node)
    if not found.ok:
        row.fail(f"{name}: {found.describe()}", leaked=len(found.leaked), lost=len(found.lost))


def _start_in_child(
    where: app.PluginSettings, api: Any, fresh: list[Any], victim_stays: bool
) -> tuple[str, str] | None:
    """Start-up (and a fresh claim) in a forked child: None, or ("crash"|"hang"|"fail", why)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child never returns
        code = 0
        try:
            os.close(read_end)
            driver = app.build_driver(where, devices=rig.devices(), api=api, log=logs.get("x"))
            wanted = fresh if not victim_stays else fresh[:1]
            problems = [r.error for r in driver.prepare(wanted).values() if r.error]
            problems += [e for e in driver.unprepare(wanted).values() if e]
            os.write(write_end, ("; ".join(problems)[:500] or "ok").encode())
        except BaseException as exc:
            os.write(write_end, f"start-up raised {type(exc).__name__}: {exc}"[:500].encode())
            code = 70
        os._exit(code)
    os.close(write_end)
    deadline = time.monotonic() + START_DEADLINE_S
    status = None
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.01)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.close(read_end)
        return ("hang", f"start-up did not finish within {START_DEADLINE_S:g}s")
    message = os.read(read_end, 4096).decode(errors="replace")
    os.close(read_end)
    if status != 0:
        return ("crash", message or f"start-up exited with status {status}")
    if message != "ok":
        return ("fail", f"fresh claims after start-up: {message}")
    return None
