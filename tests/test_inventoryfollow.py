"""What the health stream keeps listing after a rediscovery (dra_driver.inventoryfollow)."""

from __future__ import annotations

from dra_driver import inventoryfollow


def test_only_devices_that_were_listed_and_are_still_held_stay_as_vanished() -> None:
    before = {"gpu-0": (), "gpu-1": (), "gpu-2": ()}
    now = {"gpu-0": (), "gpu-2": (), "gpu-3": ()}
    held = ["gpu-1", "gpu-2", "gpu-0-vfio"]  # gpu-0-vfio was never in the stream: not ours here
    assert inventoryfollow.vanished(before, now, {}, held) == {
        "gpu-1": inventoryfollow.VANISHED_MESSAGE
    }
    # Reported once, it stays while held, and goes once its claim is unprepared.
    reported = {"gpu-1": "why"}
    assert inventoryfollow.vanished(now, now, reported, held) == {"gpu-1": "why"}
    assert inventoryfollow.vanished(now, now, reported, ["gpu-2"]) == {}
    # A GPU back under the same name is listed as a device again, not as vanished.
    assert inventoryfollow.vanished(now, {**now, "gpu-1": ()}, reported, held) == {}
