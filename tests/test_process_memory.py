"""Resident memory from /proc (process_memory.py): this process's against psutil's, an ended process, the scalars a
step logs."""

from __future__ import annotations

import subprocess
import sys

import psutil

from vla_scale.process_memory import GIB, fleet_memory, release_freed, rss_bytes


def test_the_resident_set_is_psutils_and_an_ended_process_has_none() -> None:
    held = bytearray(64 * 2**20)  # touched pages count
    held[:: 4096] = b"x" * len(held[:: 4096])
    assert abs(rss_bytes() - psutil.Process().memory_info().rss) < 2**22
    assert rss_bytes() > 64 * 2**20
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert rss_bytes(child.pid) == 0


def test_a_steps_memory_scalars() -> None:
    assert fleet_memory(2 * GIB, [GIB, 3 * GIB]) == {"memory/trainer_rss_gib": 2.0, "memory/sim_rss_gib_max": 3.0,
                                                     "memory/sim_rss_gib_sum": 4.0}
    assert fleet_memory(GIB, []) == {"memory/trainer_rss_gib": 1.0}


def test_releasing_freed_memory_gives_back_the_holes_between_live_arrays() -> None:
    """Small arrays freed between live ones stay resident until the heap's free pages are handed back."""
    arrays = [bytearray(12 * 1024) for _ in range(20_000)]  # 234 MiB in 12 KiB blocks (a 64 px frame each)
    for a in arrays:
        a[::4096] = b"x" * len(a[::4096])
    kept = arrays[1::2]
    del arrays
    before = rss_bytes()
    assert release_freed()
    assert before - rss_bytes() > 64 * 2**20, (before, rss_bytes())
    assert len(kept) == 10_000
