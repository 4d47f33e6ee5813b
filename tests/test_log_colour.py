"""``--log-format console`` colours its lines only on a terminal, and never with NO_COLOR."""

from __future__ import annotations

import io
import os
import pty
import subprocess
import sys

import pytest

from dra_driver import logs

ESC = "\x1b["


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("stream", "environ", "coloured"),
    [
        (_Terminal(), {}, True),
        (_Terminal(), {"NO_COLOR": "1"}, False),
        (_Terminal(), {"NO_COLOR": ""}, True),  # no-color.org: set and not empty
        (io.StringIO(), {}, False),
    ],
    ids=["tty", "tty-no-color", "tty-empty-no-color", "pipe"],
)
def test_console_lines_are_coloured_only_on_a_tty_without_no_color(
    stream: io.StringIO,
    environ: dict[str, str],
    coloured: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys, "stderr", stream)
    for key in ("NO_COLOR",):
        monkeypatch.delenv(key, raising=False)
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    try:
        logs.configure(level="info", fmt="console")
        logs.get("test").info("hello", claim_uid="u1")
    finally:
        monkeypatch.undo()
        logs.configure(level="info", fmt="json")
    text = stream.getvalue()
    assert "hello" in text
    assert (ESC in text) is coloured, repr(text)


CODE = "from dra_driver import logs; logs.configure(fmt='console'); logs.get('t').info('hello')"


def _on_a_pty(env: dict[str, str]) -> str:
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-c", CODE],
        stderr=follower,
        env={**{k: v for k, v in os.environ.items() if k != "NO_COLOR"}, **env},
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # EIO: the child closed its end
            break
        if not chunk:
            break
        chunks.append(chunk)
    proc.wait(timeout=30)
    os.close(leader)
    return b"".join(chunks).decode(errors="replace")


def test_a_real_process_on_a_pty_and_in_a_pipe() -> None:
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    assert ESC in _on_a_pty({})
    assert ESC not in _on_a_pty({"NO_COLOR": "1"})
    piped = subprocess.run(
        [sys.executable, "-c", CODE], capture_output=True, text=True, timeout=30, env=env
    )
    assert "hello" in piped.stderr and ESC not in piped.stderr
