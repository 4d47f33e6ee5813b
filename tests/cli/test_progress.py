"""Progress on long work: a line redrawn on stderr when it is a terminal; none with --quiet,
none in a pipe; stdout (the result) the same either way."""

from __future__ import annotations

import io
import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from dra_driver.cli import progress
from dra_driver.testing import fakefleet


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("fleet")
    made = fakefleet.make(40, profiles=("dgx-h100", "dgx-1-v100"), seed=3)
    slices, claims = root / "slices.json", root / "claims.json"
    slices.write_text(json.dumps({"kind": "List", "items": made.slices}))
    claims.write_text(json.dumps({"kind": "List", "items": made.claims}))
    return slices, claims


def _run(args: list[str], *, tty: bool) -> tuple[str, str]:
    """(stdout, stderr) of ``dra-driver ARGS``, stderr a pty when ``tty``."""
    if not tty:
        proc = subprocess.run(
            [sys.executable, "-m", "dra_driver", *args], capture_output=True, text=True, timeout=120
        )
        return proc.stdout, proc.stderr
    leader, follower = pty.openpty()
    child = subprocess.Popen(
        [sys.executable, "-m", "dra_driver", *args],
        stdout=subprocess.PIPE,
        stderr=follower,
        text=True,
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    out = child.communicate(timeout=120)[0]
    os.close(leader)
    return out, b"".join(chunks).decode()


def test_capacity_shows_progress_on_a_terminal_only(fleet: tuple[Path, Path]) -> None:
    slices, claims = fleet
    args = ["capacity", "--slices", str(slices), "--allocated", str(claims), "-o", "json"]
    out_tty, err_tty = _run(args, tty=True)
    assert "capacity: nodes 40/40" in err_tty
    assert err_tty.endswith("\r")  # the line erased: the terminal is left as it was
    out_quiet, err_quiet = _run([*args, "--quiet"], tty=True)
    out_pipe, err_pipe = _run(args, tty=False)
    assert err_quiet == "" and err_pipe == ""
    assert json.loads(out_tty) == json.loads(out_quiet) == json.loads(out_pipe)


def test_simulate_counts_claims_on_a_terminal(tmp_path: Path) -> None:
    claims = tmp_path / "claims.yaml"
    claims.write_text(
        "".join(
            "---\napiVersion: resource.k8s.io/v1\nkind: ResourceClaim\n"
            f"metadata: {{name: c{i}}}\nspec:\n  devices:\n    requests:\n    - name: gpu\n"
            "      exactly: {deviceClassName: gpu.nvidia.com, count: 1}\n"
            for i in range(5)
        )
    )
    args = ["simulate", str(claims), "--fake", "dgx-h100"]
    out, err = _run(args, tty=True)
    assert "simulate: claims 5/5" in err
    assert out == _run(args, tty=False)[0]
    assert _run([*args, "-q"], tty=True)[1] == ""


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_redraws_are_throttled() -> None:
    stream = _Terminal()
    shown = progress.Progress("x", stream=stream)
    for done in range(1, 10_001):
        shown.step(done, 10_000)
    shown.close()
    text = stream.getvalue()
    assert text.count("\r") < 20 and "x: 10,000/10,000" in text
    piped = io.StringIO()
    progress.Progress("x", stream=piped).step(1, 1)
    assert piped.getvalue() == ""
