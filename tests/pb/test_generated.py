"""Guards the committed generated code in dra_driver/pb against drift.

dra_driver/pb is produced only by scripts/gen_proto.py from our .proto files.
These tests regenerate it into a temp dir and require byte-identical files (so
a .proto edit without regeneration, a hand edit or a generator version change
is caught and the drifted file is named), exercise the script's --check and
safety behaviour, and load every generated module in one fresh process: the
short package names (v1, v1beta1, v1alpha1) must not clash in protobuf's
default descriptor pool.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gen_proto.py"
COMMITTED = REPO / "dra_driver" / "pb"


def _run_script(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


@pytest.fixture(scope="module")
def fresh_pb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """dra_driver/pb regenerated from proto/ into a temp dir, as the script does it."""
    out = tmp_path_factory.mktemp("regen") / "pb"
    done = _run_script("--out", out)
    assert done.returncode == 0, done.stderr
    return out


def _tree(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def test_committed_code_is_what_the_script_generates(fresh_pb: Path) -> None:
    committed, fresh = _tree(COMMITTED), _tree(fresh_pb)
    hint = "; run `python scripts/gen_proto.py` and commit the result"
    missing = sorted(fresh.keys() - committed.keys())
    assert not missing, f"dra_driver/pb lacks generated files {missing}{hint}"
    stale = sorted(committed.keys() - fresh.keys())
    assert not stale, f"dra_driver/pb has files no .proto generates: {stale}{hint}"
    drifted = sorted(name for name in fresh if fresh[name] != committed[name])
    assert not drifted, f"dra_driver/pb files drifted from proto/: {drifted}{hint}"
    assert len(fresh) == 35  # 6 protos x 4 outputs + 11 __init__.py


def test_check_mode_names_drifted_and_missing_files(fresh_pb: Path, tmp_path: Path) -> None:
    copy = tmp_path / "pb"
    shutil.copytree(fresh_pb, copy)
    with (copy / "dra" / "v1" / "dra_pb2.py").open("a", encoding="utf-8") as fh:
        fh.write("# hand edit\n")
    (copy / "dra_health" / "v1" / "health_pb2_grpc.pyi").unlink()

    done = _run_script("--check", "--out", copy)

    assert done.returncode == 1
    assert "dra/v1/dra_pb2.py: content differs" in done.stderr
    assert "dra_health/v1/health_pb2_grpc.pyi: missing" in done.stderr
    assert "dra_pb2_grpc.py" not in done.stderr  # untouched files are not reported


def test_refuses_to_replace_a_folder_with_foreign_files(tmp_path: Path) -> None:
    out = tmp_path / "pb"
    out.mkdir()
    notes = out / "notes.txt"
    notes.write_text("keep me", encoding="utf-8")

    done = _run_script("--out", out)

    assert done.returncode == 2
    assert "notes.txt: not a generated file" in done.stderr
    assert notes.read_text(encoding="utf-8") == "keep me"


def test_all_generated_modules_import_together_in_a_fresh_process() -> None:
    program = (
        "import importlib, pkgutil, dra_driver.pb as pb\n"
        "names = sorted(m.name for m in pkgutil.walk_packages(pb.__path__, 'dra_driver.pb.'))\n"
        "mods = [importlib.import_module(n) for n in names]\n"
        "files = sorted(m.DESCRIPTOR.name for m in mods if m.__name__.endswith('_pb2'))\n"
        "print('\\n'.join(files))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [
        "dra_driver/pb/deviceplugin/v1beta1/deviceplugin.proto",
        "dra_driver/pb/dra/v1/dra.proto",
        "dra_driver/pb/dra/v1beta1/dra.proto",
        "dra_driver/pb/dra_health/v1/health.proto",
        "dra_driver/pb/dra_health/v1alpha1/health.proto",
        "dra_driver/pb/pluginregistration/v1/registration.proto",
    ]
