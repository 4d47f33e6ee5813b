"""MIG profile tables of real GPUs, as NVML reports them: what the NVML stand-in answers from.

Why it exists: dynamic MIG publishes one device per profile *placement* and creates instances at
prepare time, so the fake GPUs must offer exactly the profiles, ids, sizes and placements real
ones do (``nvidia-smi mig -lgip`` / ``-lgipp``), or the demo and the tests would prove nothing.
A fake profile names its table (``migProfiles: h100-80gb``; docs/profiles.md).

Sources (facts only): the NVIDIA MIG user guide's "Supported MIG Profiles" tables and
``nvidia-smi mig -lgip``/``-lgipp`` transcripts of an A100-SXM4-40GB and an H100 80GB HBM3
(profile ids 19/20/15/14/9/5/0, placements ``{0..6}:1``, ``{0,2,4,6}:2``, ``{0,2,4}:2``,
``{0,4}:4``, ``{0}:4``, ``{0}:8``). Memory sizes are the MiB NVML reports (the GiB column of
``-lgip`` times 1024). The NVML_GPU_INSTANCE_PROFILE_* slot of each profile follows pynvml's
constants: 1/2/3/4/7 slices at 0/1/2/3/4, the media-extension 1-slice profile at 1_SLICE_REV1
(7), the double-memory 1-slice profile at 1_SLICE_REV2 (9).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from dra_driver import records


@records.record
class TableProfile:
    """One row of ``nvidia-smi mig -lgip`` plus its ``-lgipp`` placements."""

    slot: int
    id: int
    name: str
    slices: int
    instances: int
    memory_mib: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int
    starts: tuple[int, ...]
    size: int  # memory slices of every placement

    @property
    def placements(self) -> tuple[tuple[int, int], ...]:
        return tuple((start, self.size) for start in self.starts)


def _p(
    slot: int,
    pid: int,
    name: str,
    slices: int,
    instances: int,
    mib: int,
    sm: int,
    engines: tuple[int, int, int, int, int],
    starts: tuple[int, ...],
    size: int,
) -> TableProfile:
    ce, dec, enc, jpeg, ofa = engines
    return TableProfile(
        slot, pid, name, slices, instances, mib, sm, ce, dec, enc, jpeg, ofa, starts, size
    )


_ALL_1G = (0, 1, 2, 3, 4, 5, 6)
# fmt: off
# slot, id, name, slices, instances, MiB, SMs, (CE, DEC, ENC, JPEG, OFA), starts, size
TABLES: Final[Mapping[str, tuple[TableProfile, ...]]] = {
    "a100-sxm4-40gb": (
        _p(0, 19, "1g.5gb", 1, 7, 4864, 14, (1, 0, 0, 0, 0), _ALL_1G, 1),
        _p(1, 14, "2g.10gb", 2, 3, 9856, 28, (2, 1, 0, 0, 0), (0, 2, 4), 2),
        _p(2, 9, "3g.20gb", 3, 2, 19968, 42, (3, 2, 0, 0, 0), (0, 4), 4),
        _p(3, 5, "4g.20gb", 4, 1, 19968, 56, (4, 2, 0, 0, 0), (0,), 4),
        _p(4, 0, "7g.40gb", 7, 1, 40192, 98, (7, 5, 0, 1, 1), (0,), 8),
        _p(7, 20, "1g.5gb+me", 1, 1, 4864, 14, (1, 1, 0, 1, 1), _ALL_1G, 1),
        _p(9, 15, "1g.10gb", 1, 4, 9856, 14, (1, 1, 0, 0, 0), (0, 2, 4, 6), 2),
    ),
    "h100-80gb": (
        _p(0, 19, "1g.10gb", 1, 7, 9984, 16, (1, 1, 0, 1, 0), _ALL_1G, 1),
        _p(1, 14, "2g.20gb", 2, 3, 20096, 32, (2, 2, 0, 2, 0), (0, 2, 4), 2),
        _p(2, 9, "3g.40gb", 3, 2, 40448, 60, (3, 3, 0, 3, 0), (0, 4), 4),
        _p(3, 5, "4g.40gb", 4, 1, 40448, 64, (4, 4, 0, 4, 0), (0,), 4),
        _p(4, 0, "7g.80gb", 7, 1, 81152, 132, (8, 7, 0, 7, 1), (0,), 8),
        _p(7, 20, "1g.10gb+me", 1, 1, 9984, 16, (1, 1, 0, 1, 1), _ALL_1G, 1),
        _p(9, 15, "1g.20gb", 1, 4, 20096, 26, (1, 1, 0, 1, 0), (0, 2, 4, 6), 2),
    ),
}
# fmt: on


def names() -> list[str]:
    return sorted(TABLES)


def lookup(name: str) -> tuple[TableProfile, ...] | None:
    return TABLES.get(name)
