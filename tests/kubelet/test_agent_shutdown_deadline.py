"""The real agent process and its shutdown deadline (``--shutdown-timeout``): within it, SIGTERM
ends the agent with exit 0; past it, the agent exits 1 on its own, saying where it was, and the
claim it had prepared is still there for the next start to unprepare.

A deadline shorter than any orderly stop (1 ms) stands in for a part that hangs: what is checked
is the path from the signal to the exit, the report and that nothing is lost.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from dra_driver.testing import polling
from dra_driver.testing.fakeapi import fakeserver
from dra_driver.testing.kubeletsim import KubeletSim, PluginProcess, describe_stuck_stop

from .claimkit import put_claim


def _agent(base: Path, apiserver: fakeserver.FakeApiServer, timeout: str) -> PluginProcess:
    return PluginProcess(
        base=base,
        kubeconfig=apiserver.write_kubeconfig(base / "kubeconfig"),
        env={"SHUTDOWN_TIMEOUT": timeout},
    )


def test_an_orderly_stop_within_the_deadline_exits_0_and_reports_nothing(
    short_dir: Path, apiserver: fakeserver.FakeApiServer
) -> None:
    agent = _agent(short_dir, apiserver, "25").start()
    try:
        agent.wait_ready()
        agent.signal(signal.SIGTERM)
        assert agent.wait(30) == 0
        assert "shutdown did not finish" not in agent.log()
        assert describe_stuck_stop(agent.log()) == ""
        assert not agent.dra_socket.exists()
    finally:
        agent.kill()


def test_past_the_deadline_the_agent_exits_1_says_where_and_loses_no_claim(
    short_dir: Path, apiserver: fakeserver.FakeApiServer
) -> None:
    agent = _agent(short_dir, apiserver, "0.001").start()
    kubelet = KubeletSim(agent.registry_dir)
    try:
        agent.wait_ready()
        kubelet.register("gpu.nvidia.com")
        ref = put_claim(apiserver, "a", ["gpu-0"])
        assert not kubelet.prepare([ref]).claims[ref.uid].error
        specs = sorted(agent.cdi_root.iterdir())
        assert specs
        kubelet.close()
        agent.signal(signal.SIGTERM)
        assert agent.wait(30) == 1
        log = agent.log()
        report = [json.loads(x) for x in log.splitlines() if "shutdown did not finish" in x]
        assert len(report) == 1
        assert report[0]["level"] == "error" and report[0]["deadline_s"] == 0.001
        assert "MainThread" in report[0]["threads"]
        stuck = describe_stuck_stop(log)
        assert stuck.startswith("stuck stopping ")
        assert "dra_driver/cli/kubelet_plugin.py" in stuck  # the main thread's frames (the dump)
        assert sorted(agent.cdi_root.iterdir()) == specs  # exited without unpreparing

        again = _agent(short_dir, apiserver, "25").start()
        kubelet = KubeletSim(again.registry_dir)
        again.wait_ready()
        kubelet.register("gpu.nvidia.com")
        assert not kubelet.unprepare([ref]).claims[ref.uid].error
        polling.wait_for(
            lambda: not any(agent.cdi_root.iterdir()), what="the claim's CDI spec removed"
        )
        again.signal(signal.SIGTERM)
        assert again.wait(30) == 0
    finally:
        kubelet.close()
        agent.kill()
        if "again" in locals():
            again.kill()


def test_two_sigterms_back_to_back_stop_the_agent_at_once(
    short_dir: Path, apiserver: fakeserver.FakeApiServer
) -> None:
    """A rollout tool's SIGTERM and the kubelet's, a moment apart: the second interrupts the
    first one's handler. It once deadlocked the main thread there until the 25 s deadline
    (the fleet benchmark's rolling restarts: 2 of 3 replaced agents). The delays try the
    second signal before, while and after the first handler starts the deadline's thread."""
    for delay_s in (0.0, 0.0005, 0.002, 0.01):
        agent = _agent(short_dir, apiserver, "25").start()
        try:
            agent.wait_ready()
            agent.signal(signal.SIGTERM)
            time.sleep(delay_s)
            agent.signal(signal.SIGTERM)
            assert agent.wait(10) == 0, f"second SIGTERM {delay_s * 1000} ms after the first"
            assert "shutdown did not finish" not in agent.log()
        finally:
            agent.kill()
