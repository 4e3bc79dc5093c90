"""Resident memory of processes, read from Linux's /proc (numpy only: simulator processes and Ray workers import it).

A long RL run must not grow: TensorBoard shows each step's resident set of the trainer and of every simulator
process (`memory/trainer_rss_gib`, `memory/sim_rss_gib_max`, `memory/sim_rss_gib_sum`), so a leak shows as a slope
between the run's second step and its last."""

from __future__ import annotations

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


def fleet_memory(trainer: int, simulators: list[int]) -> dict[str, float]:
    """TensorBoard's memory scalars of a step: the trainer's resident set and its simulator processes' largest and
    total, in GiB (`trainer` and `simulators` in bytes; simulators that ended count 0)."""
    scalars = {"memory/trainer_rss_gib": trainer / GIB}
    if simulators:
        scalars["memory/sim_rss_gib_max"] = max(simulators) / GIB
        scalars["memory/sim_rss_gib_sum"] = sum(simulators) / GIB
    return scalars
