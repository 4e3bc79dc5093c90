"""Resident memory of processes, read from Linux's /proc (numpy only: simulator processes and Ray workers import it).

A long RL run must not grow: TensorBoard shows each step's resident set of the trainer and of every simulator
process (`memory/trainer_rss_gib`, `memory/sim_rss_gib_max`, `memory/sim_rss_gib_sum`), so a leak shows as a slope
between the run's second step and its last. A step's episodes come and go as many small arrays (a 64 px frame is
12 KB), which glibc's allocator keeps in its heap once freed, between the arrays still alive: the resident set then
creeps up to the largest step's working set and beyond. `release_freed` hands those free pages back at the end of
each step."""

from __future__ import annotations

import ctypes
import ctypes.util
import os

GIB = 1024**3


def rss_bytes(pid: int | None = None) -> int:
    """The resident set of process `pid` (None: this one) in bytes; 0 where it has ended or /proc cannot tell."""
    try:
        with open(f"/proc/{pid or os.getpid()}/statm") as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


def release_freed() -> bool:
    """Return the free pages of the C heap to the system (glibc's `malloc_trim(0)`); False where there is no glibc."""
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        trim = None
    if trim is None:
        return False
    trim(0)
    return True


def fleet_memory(trainer: int, simulators: list[int]) -> dict[str, float]:
    """TensorBoard's memory scalars of a step: the trainer's resident set and its simulator processes' largest and
    total, in GiB (`trainer` and `simulators` in bytes; simulators that ended count 0)."""
    scalars = {"memory/trainer_rss_gib": trainer / GIB}
    if simulators:
        scalars["memory/sim_rss_gib_max"] = max(simulators) / GIB
        scalars["memory/sim_rss_gib_sum"] = sum(simulators) / GIB
    return scalars
