"""``dra-driver demo``, the README's main command: it must run green and must be able to fail."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from dra_driver import demo
from dra_driver.demo import rig
from dra_driver.devices import fake


def test_demo_default_profile_runs_green() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "dra_driver", "--log-format", "json", "demo"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "fake profile 'dgx-h100'" in out
    # One slice: the 8 GPUs, each with its set ranks; no counters, no set devices.
    assert "published 1 ResourceSlice(s) with 8 device(s)" in out
    assert (
        "setRanks digit 4 (rank among" in out
        and "sharedCounters" not in out
        and "gpus-2-3" not in out
    )
    assert "[FAILED]" not in out
    # Every example but the one that cannot fit is prepared and unprepared.
    for example in (
        "one-gpu",
        "two-gpus-nvlink",
        "gpus-one-numa-node",
        "h100-40gi",
        "shared-by-two-containers",
        "h100-or-any-gpu",
    ):
        assert f"[ok] {example}: prepared in" in out
        assert f"[ok] {example}: unprepared, CDI spec removed" in out
    assert "ResourceClaim cannot-fit cannot be allocated" in out
    assert "allocated: gpu-" in out and "(request gpu/h100)" in out
    assert '"kind": "k8s.gpu.nvidia.com/claim"' in out
    # The health scene: a GPU fails, is tainted, and recovers.
    assert "Scene 2 of 8: health" in out
    assert "key: gpu.nvidia.com/xid" in out and "effect: NoExecute" in out
    assert "[ok] discover shows gpu-0 Unhealthy (xid=79)" in out
    assert "[ok] gpu-0 left every ranked set (setRanks = 0)" in out
    assert "[ok] an eight-GPU claim no longer fits:" in out
    assert "[ok] the eight-GPU claim fits again" in out
    assert "[ok] discover: gpu-0 Healthy, recoveries 2" in out
    assert "Scene 3 of 8: topology" in out
    # (in this run, not again on its own: the scenes are the slow part of the suite)
    assert "[ok] prepared the claim holding gpu-0" in out
    assert "[ok] rank 1 for 4 GPUs moved to gpu-4..gpu-7, the best quad left free" in out
    assert "kube-scheduler allocates: gpu-1, gpu-2, gpu-3, gpu-4 (request gpus)\n" in out
    assert "5 NVLink links between them; the best 4 free GPUs (gpu-4, gpu-5, gpu-6, gpu-7)" in out
    assert "kube-scheduler allocates: gpu-4, gpu-5, gpu-6, gpu-7 (request gpus/rank1)" in out
    assert "[ok] CDI device nodes: /dev/nvidia4, /dev/nvidia5, /dev/nvidia6, /dev/nvidia7" in out
    assert "gpus-4-5 and gpu-5 both use GPU gpu-5" in out
    assert "[ok] setRanks digit 4 again: {'gpu-0': 1, 'gpu-1': 1, 'gpu-2': 1, 'gpu-3': 1, " in out
    # The dynamic MIG scene: one H100 as 1g.10gb + 2g.20gb + 3g.40gb, made and destroyed.
    assert "Scene 4 of 8: mig" in out
    for name, device in (
        ("small (1g.10gb)", "gpu-0-mig-1g-10gb-0"),
        ("medium (2g.20gb)", "gpu-0-mig-2g-20gb-2"),
        ("large (3g.40gb)", "gpu-0-mig-3g-40gb-4"),
    ):
        assert f"[ok] {name}: allocated {device}" in out
    assert "[('1g.10gb', 0, 1), ('2g.20gb', 2, 2), ('3g.40gb', 4, 4)]" in out
    assert (
        "gpu-0-mig-4g-40gb-0: gpu-0: 1 of 7 compute slices left, 4g.40gb needs 4 at placement 0, "
        "overlaps 1g.10gb at 0, 2g.20gb at 2" in out
    )
    assert "[ok] all three unprepared; instances left on gpu-0: []" in out
    assert "[ok] gpu-0: MIG mode switched off for the full GPU" in out
    # The sharing scene: three shares of one H100 through one MPS daemon.
    assert "Scene 5 of 8: sharing" in out
    assert "[ok] one MPS control daemon serves gpu-0 for all three" in out
    assert "gpu-0 is published with allowMultipleAllocations: true" in out
    for pod, memory, threads in (("a", 20480, 25), ("b", 30720, 35), ("c", 30720, 40)):
        assert f"[ok] share-{pod}: prepared" in out
        assert f"={memory}M" in out
        assert f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={threads}" in out
    assert "gpu-0: 0 of memory left, 20Gi requested" in out
    assert "[ok] share-c: unprepared; MPS daemon gone" in out
    assert "[ok] gpu-0 back in compute mode Default" in out
    # The daemon runs in a Pod of its own, made through the demo's API server.
    assert (
        "[ok] one MPS control daemon serves gpu-0 for all three: "
        "Pod dra-driver/mps-demo-node-gpu-0-" in out
    )
    assert "[ok] the daemon Pod is pinned to demo-node, runs dra-driver:demo and is Ready" in out
    assert "[ok] the test kubelet ended the deleted Pod's daemon" in out
    # The ComputeDomain scene: a 2-node job gets IMEX channels, another clique is refused.
    assert "Scene 6 of 8: compute-domain" in out
    assert "[ok] ComputeDomain demo/nccl-job status: Ready" in out
    assert "[ok] refused, saying why (the domain lives in clique A)" in out
    # The passthrough scene: a GPU goes to a VM claim and back; no container claim meanwhile.
    assert "Scene 7 of 8: passthrough" in out
    assert "[ok] 0000:01:00.0: driver link is now vfio-pci" in out
    assert "[ok] pod: not allocatable while the VM holds the GPU" in out
    assert "[ok] 0000:01:00.0: driver link is nvidia again" in out
    # The upgrade scene: the driver upgraded under a running claim, then a GPU hot-added.
    assert "Scene 8 of 8: upgrade" in out
    assert "[ok] training is still prepared, its CDI spec byte for byte as before" in out
    assert "[ok] a claim on gpu-8 is prepared" in out
    assert out.rstrip().endswith("demo OK: every step did what it must.")


def test_demo_on_mig_profile_prepares_a_mig_device() -> None:
    out = io.StringIO()
    code = demo.run(
        backend=fake.FakeBackend.from_name("a100-mig"),
        node_name="n1",
        driver_name="gpu.nvidia.com",
        out=out,
        scenes=["core"],
    )
    assert code == 0, out.getvalue()[-3000:]
    assert "[ok] mig-1g: prepared in" in out.getvalue()


def test_demo_reports_a_broken_step_with_exit_1(monkeypatch: pytest.MonkeyPatch) -> None:
    """If a CDI spec never appears, the walk-through says so and fails."""
    monkeypatch.setattr(rig, "spec_file", lambda plugin, uid: None)
    out = io.StringIO()
    code = demo.run(
        backend=fake.FakeBackend.from_name("pcie-l4"),
        node_name="n1",
        driver_name="gpu.nvidia.com",
        out=out,
        scenes=["core"],
    )
    assert code == 1
    assert "[FAILED] one-gpu: CDI spec written" in out.getvalue()
    assert "demo FAILED" in out.getvalue()


def test_demo_unknown_profile_is_exit_2(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "dra_driver", "demo", "--fake", "nope"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert "unknown fake profile 'nope'" in proc.stderr


def test_demo_on_dgx_h100_says_why_the_mig_example_does_not_fit() -> None:
    """The default profile's H100s have MIG off: the MIG claim is refused with the reason, and
    the demo says so rather than claiming a MIG device (a100-mig prepares one, above)."""
    out = io.StringIO()
    code = demo.run(
        backend=fake.FakeBackend.from_name("dgx-h100"),
        node_name="n1",
        driver_name="gpu.nvidia.com",
        out=out,
        scenes=["core"],
    )
    text = out.getvalue()
    assert code == 0, text[-3000:]
    assert "ResourceClaim mig-1g cannot be allocated on node n1" in text
    assert "[ok] this node has no 1g.5gb MIG device (MIG devices here: none;" in text


@pytest.mark.parametrize("with_dir", [True, False])
def test_demo_keep_keeps_the_working_directory_and_says_where(
    tmp_path: Path, with_dir: bool
) -> None:
    short = Path(tempfile.mkdtemp(prefix="dk", dir="/tmp"))  # tmp_path: too long for sockets
    argv = [sys.executable, "-m", "dra_driver", "demo", "--scene", "core", "--fake", "pcie-l4"]
    argv += ["--keep", str(short / "work")] if with_dir else ["--keep"]
    kept: Path | None = None
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        [line] = [
            x for x in proc.stdout.splitlines() if x.startswith("kept the working directory: ")
        ]
        kept = Path(line.split(": ", 1)[1].split(" (", 1)[0])
        if with_dir:
            assert kept == short / "work"
        else:
            assert kept.parent == Path("/tmp") and kept.name.startswith("dra-demo-")
        assert (kept / "core").is_dir() and any((kept / "core").rglob("*.log"))
    finally:
        shutil.rmtree(short, ignore_errors=True)
        if kept is not None and not with_dir:
            shutil.rmtree(kept, ignore_errors=True)


def test_demo_keep_refuses_a_directory_too_long_for_its_sockets(tmp_path: Path) -> None:
    long = tmp_path / ("x" * 40)
    proc = subprocess.run(
        [sys.executable, "-m", "dra_driver", "demo", "--scene", "core", "--keep", str(long)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert f"dra-driver: error: --keep {long}: " in proc.stderr
    assert "use a directory of at most 40 bytes" in proc.stderr
    assert "Traceback" not in proc.stderr and not long.exists()
