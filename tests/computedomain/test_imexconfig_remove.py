"""Removing a domain's directory while its daemon writes its status file into it (the daemon
reports every interval, by temp file and rename): the directory must be gone afterwards, or the
daemon watching it and its nodes config outlive the claim. A fakeimex test caught a survivor
once in a full run (the daemon did not end within 10 s of the removal)."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path

from dra_driver.computedomain import imexconfig


def test_the_directory_is_gone_even_while_the_daemon_keeps_writing_into_it(tmp_path: Path) -> None:
    survived = 0
    for round_ in range(30):
        directory = tmp_path / f"domain-{round_}"
        imexconfig.write_config(directory, port=50000, domain="d")
        imexconfig.write_nodes(directory, ["127.0.0.1", "127.0.0.2"])
        for i in range(50):  # a directory with some files, as after a long-running daemon
            (directory / f"log-{i}").write_text("x")
        stop = threading.Event()

        def report(d: Path = directory, stop: threading.Event = stop) -> None:
            # Every millisecond (the daemons write every 50-200 ms): the race, made likely.
            while not stop.wait(0.001):
                with contextlib.suppress(OSError):  # gone: the daemon notices at its next check
                    imexconfig.write_status(d, "READY")

        writer = threading.Thread(target=report)
        writer.start()
        try:
            imexconfig.remove(directory)
            survived += directory.exists()
        finally:
            stop.set()
            writer.join(5)
    assert survived == 0, f"{survived} of 30 directories survived their removal"
