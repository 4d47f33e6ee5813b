"""The publisher's loops do not spin: after a pass the reconcile loop sleeps until woken (and
set_desired does wake it), and a failing watch is retried with backoff, not at once."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from typing import Any

from dra_driver.kube import api
from dra_driver.slices import publisher
from dra_driver.testing.fakeapi import memory

from .test_publisher import DRIVER, Recorder, desired, wait_for


class Counting:
    """The in-memory API, counting LIST and WATCH calls and signalling each one."""

    def __init__(self, mem: memory.InMemoryApi, *, watch_fails: bool = False) -> None:
        self.mem = mem
        self.lists = 0
        self.watches = 0
        self.listed = threading.Event()
        self.watched = threading.Event()
        self.watch_fails = watch_fails

    def __getattr__(self, name: str) -> Any:
        return getattr(self.mem, name)

    def list_resource_slices(self, **kw: Any) -> tuple[list[api.Obj], str]:
        self.lists += 1
        self.listed.set()
        return self.mem.list_resource_slices(**kw)

    def watch_resource_slices(self, **kw: Any) -> Iterator[api.WatchEvent]:
        self.watches += 1
        self.watched.set()
        if self.watch_fails:
            raise api.ApiError(500, "watch refused")
        return self.mem.watch_resource_slices(**kw)


def make(kube: Counting, **kw: Any) -> publisher.Publisher:
    return publisher.Publisher(
        kube=kube,  # type: ignore[arg-type]
        driver_name=DRIVER,
        node_name="n1",
        backoff=publisher.Backoff(rng=random.Random(1)),
        log=Recorder(),
        **kw,
    )


def test_after_a_pass_the_loop_sleeps_until_set_desired_wakes_it() -> None:
    mem = memory.InMemoryApi()
    mem.put_node("n1", uid="u")
    kube = Counting(mem)
    pub = make(kube, resync_s=600.0, watch_timeout_s=60.0)
    pub.set_desired(desired())
    thread = threading.Thread(target=pub.run, daemon=True)
    thread.start()
    try:
        wait_for(pub.synced.is_set)
        assert kube.lists == 1
        kube.listed.clear()
        # Nothing changed and the resync is minutes away: no further LIST (a loop that kept
        # its wake-up set would spin here, listing as fast as it can).
        assert not kube.listed.wait(0.5)
        assert kube.lists == 1
        pub.set_desired(desired("h100-nvl-pairs"))  # new hardware: reconciled at once
        assert kube.listed.wait(10)
        wait_for(pub.synced.is_set)
        assert kube.lists == 2
    finally:
        pub.stop()
        thread.join(10)
    assert not thread.is_alive()


def test_a_failing_watch_is_retried_with_backoff() -> None:
    mem = memory.InMemoryApi()
    mem.put_node("n1", uid="u")
    kube = Counting(mem, watch_fails=True)
    pub = make(kube, resync_s=600.0, watch_timeout_s=60.0)
    pub.set_desired(desired())
    pub.start()
    try:
        wait_for(pub.synced.is_set)
        assert kube.watched.wait(10)
        wait_for(lambda: kube.watches >= 2)  # it does try again ...
        threading.Event().wait(0.5)
        # ... after 0.1-0.2 s, then 0.2-0.4 s, ...: a handful in half a second, not thousands
        assert kube.watches <= 6
    finally:
        pub.stop()
