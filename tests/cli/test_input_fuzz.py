"""No traceback on any input: every file the command line names, fed garbage, is one line, exit 2.

The readers are found in the argparse tree, not listed here: every argument declared with
``type=inputfile.path`` (dra_driver/inputfile.py) is fuzzed with random bytes, a NUL, invalid
UTF-8, one 10 MB line, nesting 100,000 deep, a 50 MB file, a directory, a FIFO no one writes
and a missing file; the answer must be exit 2 and exactly one line on stderr naming the file.
Any other ``Path`` argument must be one of :data:`NOT_READ` (directories, kubeconfigs read by
the client): a new ``type=Path`` flag fails :func:`test_every_path_argument_is_classified`
until it is either a reader (and fuzzed) or listed there. In this process (the readers fail
before any side effect); a sample runs as real processes.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dra_driver import cli, inputfile

REPO = Path(__file__).resolve().parents[2]
CLAIM = REPO / "deployments" / "examples" / "one-gpu.yaml"

# Path arguments that are not input files read by content (or, the kubeconfig, read by the
# Kubernetes client with its own errors, tested in test_bad_kubeconfig.py).
NOT_READ = {
    ("dev-cluster", "--dir"),
    ("dev-cluster", "--write-kubeconfig"),
    ("device-plugin", "--kubeconfig"),
    ("discover", "--vfio-root"),
    ("kubelet-plugin", "--vfio-root"),
    ("discover", "--kubelet-plugins-dir"),
    ("discover", "--device-plugin-dir"),
    ("slices", "--kubeconfig"),
    ("publish", "--kubeconfig"),
    ("capacity", "--kubeconfig"),
    ("demo", "--keep"),
    ("kubelet-plugin", "--kubelet-registry-dir"),
    ("kubelet-plugin", "--kubelet-plugins-dir"),
    ("kubelet-plugin", "--cdi-root"),
    ("kubelet-plugin", "--metadata-dir"),
    ("kubelet-plugin", "--kubeconfig"),
    ("kubelet-plugin", "--driver-root"),
    ("kubelet-plugin", "--driver-root-mount"),
    ("kubelet-plugin", "--boot-id-file"),
    ("kubelet-plugin", "--dev-root"),
    ("device-plugin", "--device-plugin-dir"),
    ("device-plugin", "--cdi-root"),
    ("device-plugin", "--mps-dir"),
    ("device-plugin", "--driver-root"),
    ("fake-event", "--kubelet-plugins-dir"),
    ("fake-event", "--device-plugin-dir"),
    ("nvml-release", "--kubelet-plugins-dir"),
    ("nvml-release", "--device-plugin-dir"),
    ("kubelet-plugin", "--nvidia-proc-dir"),  # a kernel file's text, compared, never parsed
    ("doctor", "--kubeconfig"),
    ("controller", "--kubeconfig"),
    ("imex-daemon", "--config-dir"),
    ("imex-daemon", "--driver-root"),
}
# What a command needs besides the file under test to reach its reader.
NEEDS: dict[str, list[str]] = {
    "slices": ["--node-name", "n1"],
    "publish": ["--node-name", "n1"],
    "kubelet-plugin": ["--node-name", "n1"],
}


def subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser([])
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _path_arguments() -> list[tuple[str, str, argparse.Action]]:
    return [
        (command, action.dest if not action.option_strings else action.option_strings[0], action)
        for command, parser in subparsers().items()
        for action in parser._actions
        if action.type in (Path, inputfile.path)
    ]


def readers() -> list[tuple[str, str]]:
    """(command, flag or positional's dest) of every argument declared as an input file."""
    return [(c, n) for c, n, a in _path_arguments() if a.type is inputfile.path]


READERS = readers()


def argv_for(command: str, arg: str, file: Path, *, slices: Path) -> list[str]:
    """The command line that makes ``command`` read ``file`` as ``arg``."""
    parser = subparsers()[command]
    positional = [a for a in parser._actions if not a.option_strings and a.dest != "help"]
    if not arg.startswith("-"):
        return [command, str(file), *NEEDS.get(command, [])]
    words = [command, *(str(CLAIM) for a in positional if a.required or a.nargs is None)]
    if command == "capacity" and arg == "--allocated":
        words += ["--slices", str(slices)]
    return [*words, *NEEDS.get(command, []), arg, str(file)]


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each kind of garbage, made once (the 50 MB file is read by every reader)."""
    root = tmp_path_factory.mktemp("fuzz")
    rng = random.Random(47)
    files = {
        "random": rng.randbytes(4096),
        "nul": b"apiVersion: v1\x00kind: ResourceClaim\n",
        "invalid-utf8": b"kind: ResourceClaim\nmetadata: {name: \xc3\x28}\n",
        "10MB-line": b"x" * 10_000_000,
        "deep": b"[" * 100_000 + b"]" * 100_000,
        # Random bytes without a NUL, so that the decoder, not the NUL check, refuses it.
        "50MB": rng.randbytes(50 * 2**20).replace(b"\x00", b"\x01"),
    }
    out: dict[str, Path] = {}
    for name, data in files.items():
        out[name] = root / name
        out[name].write_bytes(data)
    out["directory"] = root / "a-directory"
    out["directory"].mkdir()
    out["fifo"] = root / "fifo"
    os.mkfifo(out["fifo"])
    out["missing"] = root / "missing.yaml"
    return out


@pytest.fixture(scope="module")
def slices_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("slices") / "slices.yaml"
    proc = subprocess.run(
        [sys.executable, "-m", "dra_driver", "slices", "--fake", "dgx-h100", "--node-name", "n1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    path.write_text(proc.stdout)
    return path


def test_every_path_argument_is_classified() -> None:
    """A ``Path`` argument is either a reader (fuzzed below) or known not to be read."""
    unclassified = [(c, n) for c, n, a in _path_arguments() if a.type is Path]
    assert sorted(set(unclassified) - NOT_READ) == []
    assert not set(READERS) & NOT_READ
    # The readers of the issue, found in the tree (a sanity floor, not the list fuzzed).
    for expected in [
        ("simulate", "claim"),
        ("simulate", "--class"),
        ("simulate", "--slices"),
        ("simulate", "--allocated"),
        ("simulate", "--fake-file"),
        ("capacity", "--slices"),
        ("capacity", "--allocated"),
        *((c, "--fake-file") for c in ("discover", "slices", "labels", "demo", "publish")),
    ]:
        assert expected in READERS


@pytest.mark.parametrize(("command", "arg"), READERS, ids=[f"{c} {a}" for c, a in READERS])
def test_reader_refuses_garbage_in_one_line(
    command: str,
    arg: str,
    bad_files: dict[str, Path],
    slices_file: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for kind, file in bad_files.items():
        argv = argv_for(command, arg, file, slices=slices_file)
        code = cli.main(argv)
        out = capsys.readouterr()
        lines = out.err.splitlines()
        assert (code, len(lines)) == (2, 1), f"{kind}: {argv}: rc {code}, stderr {out.err[:500]!r}"
        assert str(file) in lines[0], (kind, lines[0])
        assert lines[0].startswith("dra-driver: error: "), (kind, lines[0])
        assert len(lines[0]) < 400, (kind, lines[0])


@pytest.mark.parametrize(
    ("args", "kind"),
    [
        (["simulate", "{file}"], "50MB"),
        (["capacity", "--slices", "{file}"], "fifo"),
        (["kubelet-plugin", "--node-name", "n1", "--fake-file", "{file}"], "invalid-utf8"),
        (["device-plugin", "--fake-file", "{file}"], "directory"),
    ],
)
def test_as_a_process(args: list[str], kind: str, bad_files: dict[str, Path]) -> None:
    file = bad_files[kind]
    proc = subprocess.run(
        [sys.executable, "-m", "dra_driver", *(a.format(file=file) for a in args)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    assert str(file) in proc.stderr


@pytest.mark.parametrize("kind", ["invalid-utf8", "nul", "directory", "fifo", "50MB"])
def test_render_chart_values(kind: str, bad_files: dict[str, Path]) -> None:
    """``scripts/render_chart.py -f``: the same reader, the same one line."""
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "render_chart.py"), "-f", str(bad_files[kind])],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    assert str(bad_files[kind]) in proc.stderr


def test_a_pipe_with_a_writer_is_read() -> None:
    """A pipe is read, not refused: ``--slices <(kubectl get resourceslices -o json)`` (the shell
    hands over ``/dev/fd/N``, a pipe its writer holds open) waits for the writer's data."""
    read_end, write_end = os.pipe()

    def write() -> None:
        time.sleep(0.2)
        os.write(write_end, b"a: 1\n")
        os.close(write_end)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        assert inputfile.read_text(Path(f"/dev/fd/{read_end}")) == "a: 1\n"
    finally:
        writer.join(timeout=10)
        os.close(read_end)


def test_size_cap(tmp_path: Path) -> None:
    big = tmp_path / "big"
    big.write_bytes(b"a" * 2048)
    with pytest.raises(inputfile.InputFileError, match=r"larger than 1,024 bytes"):
        inputfile.read_text(big, limit=1024)
    assert inputfile.read_text(big, limit=2048) == "a" * 2048


def test_messages_name_the_offset(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"abc\xffdef")
    with pytest.raises(inputfile.InputFileError, match=r"bad\.yaml: not UTF-8 .*0xff at offset 3"):
        inputfile.read_text(bad)
    bad.write_bytes(b"ab\x00")
    with pytest.raises(inputfile.InputFileError, match=r"NUL byte at offset 2"):
        inputfile.read_text(bad)
    with pytest.raises(inputfile.InputFileError, match=r"character device"):
        inputfile.read_text(Path("/dev/null"))
