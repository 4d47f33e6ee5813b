"""``dra-driver imex-daemon``: NVIDIA's IMEX daemon run as a child, its readiness (from
``nvidia-imex-ctl -q``) written to ``status.json``, its death, a hung query, a forwarded SIGTERM,
a daemon that detaches, a new nodes config and missing binaries — with stand-in ``nvidia-imex``
and ``nvidia-imex-ctl`` shell scripts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver import cli, logs
from dra_driver import computedomain as cd
from dra_driver.computedomain import api as cdapi
from dra_driver.computedomain import imexconfig, imexdaemon, manifests

# The stand-in IMEX daemon: logs its start, detaches (exits 0) when told, ends with 3 when told
# to die, and records a SIGTERM before exiting 0 on it.
FAKE_IMEX = """#!/bin/sh
STATE={state}
echo "start $$ $*" >> "$STATE/imex.log"
if [ -f "$STATE/detach" ]; then exit 0; fi
trap 'echo "TERM $$" >> "$STATE/imex.log"; exit 0' TERM
while :; do
  if [ -f "$STATE/die" ]; then exit 3; fi
  sleep 0.05
done
"""
# The stand-in nvidia-imex-ctl: answers what $STATE/answer says (HANG: never; FAIL: an error);
# -N lists two peers, the second in the answer's state.
FAKE_CTL = """#!/bin/sh
STATE={state}
echo "$*" >> "$STATE/ctl.log"
answer=$(cat "$STATE/answer" 2>/dev/null || echo NOT_READY)
case "$answer" in
  HANG) sleep 30; exit 0;;
  FAIL) echo "cannot connect to the IMEX daemon"; exit 1;;
esac
case "$*" in
  *-N*) echo "Nodes:"
        echo "Node #0   - 10.0.0.1   - READY   - Version: 570"
        echo "Node #1   - 10.0.0.2   - $answer"
        echo "Domain State: UP";;
  *) echo "$answer";;
esac
"""
LOG = logs.get("test-imex-daemon")


class Rig:
    """A domain directory, the stand-in binaries and their state files."""

    def __init__(self, tmp: Path) -> None:
        self.directory = tmp / "imexd"
        self.state = tmp / "state"
        self.bin = tmp / "bin"
        for d in (self.state, self.bin):
            d.mkdir()
        imexconfig.write_config(self.directory, port=50000, domain="team/job")
        imexconfig.write_nodes(self.directory, ["10.0.0.1", "10.0.0.2"])
        for name, text in ((imexdaemon.IMEX, FAKE_IMEX), (imexdaemon.IMEX_CTL, FAKE_CTL)):
            path = self.bin / name
            path.write_text(text.format(state=self.state))
            path.chmod(0o755)

    def options(self, **overrides: Any) -> imexdaemon.Options:
        settings: dict[str, Any] = {
            "directory": self.directory,
            "imex": str(self.bin / imexdaemon.IMEX),
            "ctl": str(self.bin / imexdaemon.IMEX_CTL),
            "interval_s": 0.05,
            "ctl_timeout_s": 2.0,
            "stop_timeout_s": 5.0,
        }
        return imexdaemon.Options(**{**settings, **overrides})

    def answer(self, word: str) -> None:
        (self.state / "answer").write_text(word + "\n")

    def status(self) -> dict[str, Any]:
        try:
            value = json.loads((self.directory / imexconfig.STATUS).read_text())
        except (FileNotFoundError, ValueError):
            return {}
        assert isinstance(value, dict)
        return value

    def imex_log(self) -> list[str]:
        try:
            return (self.state / "imex.log").read_text().splitlines()
        except FileNotFoundError:
            return []


class Running:
    """A supervisor's ``run()`` on a thread."""

    def __init__(self, supervisor: imexdaemon.Supervisor) -> None:
        self.supervisor = supervisor
        self.result: list[int] = []
        self.thread = threading.Thread(target=lambda: self.result.append(supervisor.run()))
        self.thread.start()

    def wait(self, timeout: float = 15.0) -> int:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the supervisor did not end"
        return self.result[0]


def wait_for(check: Callable[[], object], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return Rig(tmp_path)


@pytest.fixture
def start(rig: Rig) -> Iterator[Callable[..., Running]]:
    started: list[Running] = []

    def run(**overrides: Any) -> Running:
        running = Running(imexdaemon.Supervisor(rig.options(**overrides), log=LOG))
        started.append(running)
        return running

    yield run
    for running in started:  # never leave a stand-in daemon behind
        if running.thread.is_alive():
            running.supervisor.request_stop(signal.SIGTERM)
            running.wait()


def test_not_ready_until_ctl_says_ready_then_ready_with_the_peers(
    rig: Rig, start: Callable[..., Running]
) -> None:
    rig.answer("INITIALIZING")
    running = start()
    wait_for(lambda: rig.status().get("ctl") == "INITIALIZING", "a first status")
    assert rig.status()["state"] == "NOT_READY"
    assert not imexconfig.daemon_ready(rig.directory)
    assert rig.imex_log()[0].endswith(f"-c {rig.directory / 'imexd.cfg'}")
    rig.answer("READY")
    wait_for(lambda: rig.status().get("state") == "READY", "READY")
    status = rig.status()
    assert status["peers"] == {"10.0.0.1": "READY", "10.0.0.2": "READY"}
    assert status["nodes"] == ["10.0.0.1", "10.0.0.2"] and status["daemon"] == "child"
    assert imexconfig.daemon_ready(rig.directory)
    ctl_calls = (rig.state / "ctl.log").read_text().splitlines()
    assert f"-c {rig.directory / 'imexd.cfg'} -q" in ctl_calls
    rig.answer("FAIL")  # the daemon stops answering: not ready any more, the child lives on
    wait_for(lambda: rig.status().get("state") == "NOT_READY", "NOT_READY again")
    assert rig.status()["ctl"] == "cannot" and rig.status()["peers"] == {}
    running.supervisor.request_stop(signal.SIGTERM)
    assert running.wait() == 0


def test_the_child_dying_exits_1_and_leaves_not_ready(
    rig: Rig, start: Callable[..., Running]
) -> None:
    rig.answer("READY")
    running = start()
    wait_for(lambda: rig.status().get("state") == "READY", "READY")
    (rig.state / "die").touch()
    assert running.wait() == 1
    assert rig.status()["state"] == "NOT_READY"
    assert rig.status()["reason"] == "IMEX daemon exited"
    assert not imexconfig.daemon_ready(rig.directory)


def test_a_hung_ctl_is_not_ready_and_never_hangs_the_loop(
    rig: Rig, start: Callable[..., Running]
) -> None:
    rig.answer("HANG")
    began = time.monotonic()
    running = start(ctl_timeout_s=0.3)
    wait_for(lambda: rig.status().get("ctl") == "TIMEOUT", "a timed-out query", timeout=5)
    assert time.monotonic() - began < 5
    assert rig.status()["state"] == "NOT_READY"
    rig.answer("READY")  # the loop goes on
    wait_for(lambda: rig.status().get("state") == "READY", "READY after the hang")
    running.supervisor.request_stop(signal.SIGTERM)
    assert running.wait() == 0


def test_a_new_nodes_config_restarts_the_daemon_on_it(
    rig: Rig, start: Callable[..., Running]
) -> None:
    rig.answer("READY")
    running = start()
    wait_for(lambda: rig.status().get("state") == "READY", "READY")
    imexconfig.write_nodes(rig.directory, ["10.0.0.1", "10.0.0.2", "10.0.0.3"])
    wait_for(lambda: sum(line.startswith("start") for line in rig.imex_log()) == 2, "a restart")
    assert any(line.startswith("TERM") for line in rig.imex_log())  # the old one was stopped
    wait_for(lambda: len(rig.status().get("nodes", [])) == 3, "the new nodes in the status")
    running.supervisor.request_stop(signal.SIGTERM)
    assert running.wait() == 0


def test_a_detached_daemon_is_followed_through_ctl_until_it_stops_answering(
    rig: Rig, start: Callable[..., Running]
) -> None:
    (rig.state / "detach").touch()  # nvidia-imex with DAEMONIZE=1: the child exits 0 at once
    rig.answer("READY")
    running = start(lost_after_s=0.5)
    wait_for(lambda: rig.status().get("daemon") == "detached", "the detached daemon's status")
    assert rig.status()["state"] == "READY"
    rig.answer("FAIL")
    assert running.wait() == 1
    assert rig.status()["state"] == "NOT_READY"
    assert rig.status()["reason"] == "IMEX daemon stopped answering"


def test_a_detached_daemon_with_a_new_nodes_config_exits_for_a_restart(
    rig: Rig, start: Callable[..., Running]
) -> None:
    (rig.state / "detach").touch()
    rig.answer("READY")
    running = start()
    wait_for(lambda: rig.status().get("daemon") == "detached", "the detached daemon's status")
    imexconfig.write_nodes(rig.directory, ["10.0.0.1"])
    assert running.wait() == 1
    assert rig.status()["state"] == "NOT_READY"


def test_the_directory_going_stops_the_daemon(rig: Rig, start: Callable[..., Running]) -> None:
    rig.answer("READY")
    running = start()
    wait_for(lambda: rig.status().get("state") == "READY", "READY")
    imexconfig.remove(rig.directory)
    assert running.wait() == 0
    assert any(line.startswith("TERM") for line in rig.imex_log())


def test_peers_are_read_from_the_node_table() -> None:
    table = (
        "Connectivity Table Legend:\nC - Connected - Ready for operation\n\n"
        "3/25/2025 10:39:43.659\nNodes:\nNode #0   - 10.136.206.48   - READY\n"
        "Node #1   - 10.136.206.49   - UNAVAILABLE   - Version: 570.124.06\n\n"
        " Nodes From\\To  0   1\n       0        C   N\nDomain State: UP\n"
    )
    assert imexdaemon.peers(table) == {"10.136.206.48": "READY", "10.136.206.49": "UNAVAILABLE"}


def test_binaries_come_from_the_flag_then_path_then_the_driver_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "driver-root"
    (root / "usr/bin").mkdir(parents=True)
    binary = root / "usr/bin" / imexdaemon.IMEX
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    found = imexdaemon.find_binary(imexdaemon.IMEX, explicit=None, driver_root=root)
    assert found == str(binary)
    assert imexdaemon.find_binary("x", explicit=str(binary), driver_root=None) == str(binary)
    with pytest.raises(imexdaemon.MissingBinary, match="nvidia-imex-ctl is not on PATH"):
        imexdaemon.find_binary(imexdaemon.IMEX_CTL, explicit=None, driver_root=root)
    with pytest.raises(imexdaemon.MissingBinary, match="is not an executable file"):
        imexdaemon.find_binary(imexdaemon.IMEX, explicit=str(tmp_path / "nope"), driver_root=root)


def _wrapper(rig: Rig, tmp: Path, *args: str, path: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("IMEX_")}
    command = [sys.executable, "-m", "dra_driver", "--log-format", "json", "imex-daemon"]
    return subprocess.Popen(
        [*command, "--config-dir", str(rig.directory), "--driver-root", str(tmp / "none"), *args],
        env={**env, "PATH": path},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_sigterm_reaches_the_child_and_the_wrapper_exits_0(rig: Rig, tmp_path: Path) -> None:
    rig.answer("READY")
    proc = _wrapper(
        rig, tmp_path, "--interval", "0.05", path=f"{rig.bin}{os.pathsep}{os.environ['PATH']}"
    )
    try:
        wait_for(lambda: rig.status().get("state") == "READY", "READY", timeout=30)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert any(line.startswith("TERM") for line in rig.imex_log())
    assert rig.status()["state"] == "NOT_READY"
    events = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    stopped = [e for e in events if e["event"] == "IMEX daemon stopped"]
    assert stopped and stopped[0]["signal"] == "SIGTERM"
    assert stopped[0]["outcome"] == "exit status 0"


def test_a_missing_binary_is_one_clear_line_and_exit_2(rig: Rig, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    proc = _wrapper(rig, tmp_path, path=str(tmp_path / "empty"))
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("dra-driver: error: nvidia-imex is not on PATH")
    assert not (rig.directory / imexconfig.STATUS).exists()


def test_a_missing_config_is_refused(tmp_path: Path, rig: Rig) -> None:
    (rig.directory / imexconfig.CONFIG).unlink()
    proc = _wrapper(rig, tmp_path, path=str(rig.bin))
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2 and "imexd.cfg does not exist" in err


def _domain() -> cdapi.Domain:
    return cdapi.Domain.from_obj(
        {
            "metadata": {"name": "job", "namespace": "team", "uid": "0f1e2d3c-aaaa-bbbb"},
            "spec": {"numNodes": 2, "channel": {"resourceClaimTemplate": {"name": "job-ch"}}},
        }
    )


def test_real_daemon_pods_run_the_wrapper_with_the_driver_root_and_privileges() -> None:
    settings = manifests.Settings(namespace="dra", driver_root="/run/nvidia/driver")
    pod = manifests.daemon_set(_domain(), settings)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["dra-driver", "imex-daemon", "--config-dir", cd.DAEMON_DIR]
    assert container["securityContext"]["privileged"] is True
    assert container["volumeMounts"] == [
        {"name": "driver-root", "mountPath": imexdaemon.DRIVER_ROOT_MOUNT, "readOnly": True}
    ]
    assert pod["volumes"][0]["hostPath"] == {"path": "/run/nvidia/driver", "type": "Directory"}
    args = cli.build_parser(list(manifests.IMEX_COMMAND[1:])).parse_args(
        list(manifests.IMEX_COMMAND[1:])
    )
    assert args.config_dir == Path(cd.DAEMON_DIR)
    assert args.driver_root == Path(imexdaemon.DRIVER_ROOT_MOUNT)


def test_fake_daemon_pods_get_neither_privileges_nor_the_driver_root() -> None:
    settings = manifests.Settings(namespace="dra", command=manifests.FAKE_IMEX_COMMAND)
    pod = manifests.daemon_set(_domain(), settings)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    # Root (the stand-in writes status.json into the root-owned /imexd), with no capabilities.
    assert container["securityContext"] == {
        "runAsUser": 0,
        "runAsGroup": 0,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    assert "volumeMounts" not in container
    assert "volumes" not in pod
