"""Driving a `SimFleet` the way a rollout does, without a policy: `pipeline_overlap.py`'s stepping loop.

Every slot steps still chunks (all-zero actions): one request per pipeline stage in flight, each stage's next chunk
sent as soon as its answer arrives. It imports neither torch nor Ray's driver setup.
"""

from __future__ import annotations

import numpy as np

from vla_scale.sim.fleet import SimFleet


def step_still(fleet: SimFleet, chunks: int, chunk_len: int, action_dim: int = 7) -> int:
    """Step every slot `chunks` times with an all-zero chunk, stage requests overlapped; the env steps taken."""
    stage = fleet.slot_stages()
    zeros = np.zeros((fleet.size, chunk_len, action_dim), dtype=np.float32)
    for s in range(fleet.stages):
        fleet.send_step(zeros, stage == s)
    steps = 0
    for i in range(fleet.stages * chunks):
        steps += sum(r.steps_taken for r in fleet.recv() if r is not None)
        if i < fleet.stages * (chunks - 1):
            fleet.send_step(zeros, stage == i % fleet.stages)
    return steps
