"""Resident memory from /proc (process_memory.py): this process's against psutil's, an ended process, the scalars a
step logs."""

from __future__ import annotations

import subprocess
import sys

import psutil

from vla_scale.process_memory import GIB, fleet_memory, rss_bytes


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
