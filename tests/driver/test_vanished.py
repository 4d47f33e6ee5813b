"""Which prepared records lost their GPU: by device name and by the GPU UUID handed out."""

from __future__ import annotations

from dra_driver.devices.fake import FakeBackend
from dra_driver.driver import checkpoint, inventory, vanished


def record(uid: str, device: str, uuid: str) -> checkpoint.ClaimRecord:
    return checkpoint.ClaimRecord(
        uid=uid,
        namespace="team",
        name=uid,
        state="PrepareCompleted",
        bootId="b",
        devices=(
            checkpoint.DeviceRecord(
                requestNames=("gpu",), poolName="n1", deviceName=device, cdiDeviceIds=("x",)
            ),
        ),
        cdiSpec={"containerEdits": {"env": [f"NVIDIA_VISIBLE_DEVICES={uuid}"]}, "devices": []},
    )


def test_stale_by_name_by_uuid_and_never_when_hidden() -> None:
    backend = FakeBackend.from_name("pcie-l4")
    before = backend.discover()
    gone = backend.nvml.remove_gpu(1)
    devices = inventory.build(backend.discover(), mig_minors=None)
    records = [
        record("kept", "gpu-0", before.gpus[0].uuid),
        record("removed", "gpu-1", gone),
        record("replaced", "gpu-2", "GPU-00000000-0000-4000-8000-000000000000"),
    ]
    stale = {r.uid: lost for r, lost in vanished.stale_records(records, devices)}
    assert stale == {"removed": ("gpu-1",), "replaced": ("gpu-2",)}
    hidden = vanished.stale_records(records, devices, hidden=lambda uuid: uuid == gone)
    assert [r.uid for r, _ in hidden] == ["replaced"]
    assert vanished.record_gpu_uuids(records[1]) == {gone}
