"""ImageWriter.pack: each answer's images land in its slot's row, everything else as `SlotBatch.pack` gives it."""

from __future__ import annotations

import numpy as np
import pytest

from vla_scale.envs.types import ChunkStep, Observation
from vla_scale.parallel.sim.shared_images import ImageReader, ImageWriter
from vla_scale.parallel.sim.slot_batch import SlotBatch


def answers(slots: int, answered: list[int], side: int, seed: int) -> list[Observation | ChunkStep | None]:
    rng = np.random.default_rng(seed)
    out: list[Observation | ChunkStep | None] = [None] * slots
    for slot in answered:
        images = {cam: rng.integers(0, 256, (side, side, 3), dtype=np.uint8) for cam in ("front", "wrist")}
        obs = Observation(images, rng.standard_normal(4).astype(np.float32), f"task {slot}")
        out[slot] = ChunkStep(obs, float(slot), slot % 2 == 0, slot == 3, slot + 1, {"slot": slot})
    return out


def test_pack_writes_each_image_into_its_slot_row_and_keeps_the_rest() -> None:
    writer, reader = ImageWriter(num_slots=6), ImageReader()
    try:
        results = answers(6, [1, 3, 4], side=8, seed=0)
        batch = writer.pack("step", results)
        expected = SlotBatch.pack("step", results)
        assert set(batch.shared) == {"front", "wrist"} and all(len(a) == 0 for a in batch.images.values())
        for camera in ("front", "wrist"):
            rows = writer.blocks[camera][1]
            for row, slot in enumerate(expected.index):
                np.testing.assert_array_equal(rows[slot], expected.images[camera][row])
        for name in ("index", "proprio", "reward", "done", "success", "steps_taken"):
            np.testing.assert_array_equal(getattr(batch, name), getattr(expected, name))
        assert batch.instructions == expected.instructions and batch.infos == expected.infos

        got = reader.take(batch)
        for camera in ("front", "wrist"):
            np.testing.assert_array_equal(got.images[camera], expected.images[camera])

        # the next request reuses the blocks; a new frame size replaces them
        names = {camera: shm.name for camera, (shm, _) in writer.blocks.items()}
        writer.pack("step", answers(6, [0], side=8, seed=1))
        assert {camera: shm.name for camera, (shm, _) in writer.blocks.items()} == names
        bigger = writer.pack("step", answers(6, [5], side=16, seed=2))
        assert bigger.shared["front"][1] == (6, 16, 16, 3) and bigger.shared["front"][0] != names["front"]
        assert reader.take(bigger).images["front"].shape == (1, 16, 16, 3)
    finally:
        reader.close()
        writer.close()


def test_frames_of_two_sizes_in_one_answer_are_refused() -> None:
    writer = ImageWriter(num_slots=2)
    try:
        results = answers(2, [0], side=8, seed=3)
        results[1] = answers(2, [1], side=16, seed=4)[1]
        with pytest.raises(ValueError, match="camera 'front' gave frames of shapes"):
            writer.pack("step", results)
    finally:
        writer.close()


def test_pack_of_no_answers_shares_nothing() -> None:
    writer = ImageWriter(num_slots=3)
    try:
        batch = writer.pack("step", [None, None, None])
        assert batch.shared == {} and batch.images == {} and len(batch.index) == 0 and batch.size == 3
    finally:
        writer.close()


def test_blocks_of_processes_that_no_longer_exist_are_removed(tmp_path) -> None:
    """Blocks carry their maker's pid; `remove_orphans` removes those of dead processes only, and nothing not ours."""
    import os
    import subprocess
    import sys

    from vla_scale.parallel.sim.shared_images import BLOCK_PREFIX, ImageWriter, remove_orphans

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True).stdout.strip()
    for name in (f"{BLOCK_PREFIX}{dead}_0a1b2c3d", f"{BLOCK_PREFIX}{os.getpid()}_0a1b2c3d", "psm_0a1b2c3d"):
        (tmp_path / name).write_bytes(b"\0" * 16)
    assert remove_orphans(tmp_path) == [f"{BLOCK_PREFIX}{dead}_0a1b2c3d"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"{BLOCK_PREFIX}{os.getpid()}_0a1b2c3d",
                                                                  "psm_0a1b2c3d"])
    writer = ImageWriter(2)  # a real block is named after this process
    shm, _ = writer._block("agentview", (4, 4, 3))
    assert shm.name.startswith(f"{BLOCK_PREFIX}{os.getpid()}_")
    writer.close()
