"""Camera images passed from a simulator process to its parent through shared memory.

A pipe moves a request's images only while the parent reads (the child blocks once the socket buffer is full),
which made the hand-over cost as much as the simulation. Instead every slot owns a fixed row of a shared block per
camera: the child writes the rows it answers, the pipe carries only the block's name and the slot indices, and the
parent copies the rows out when it receives the answer. A slot's row is written again only after its next request,
which the parent sends after it has received this answer, so a row is never overwritten while still unread.

A block is named after the process that made it (`vla_images_<pid>_<random>`): a simulator killed with its whole
process tree (a lost node's, resource tracker included) cannot remove its blocks, and `remove_orphans` (run as a
fleet closes) removes those of processes that no longer exist.
"""

from __future__ import annotations

import os
import secrets
from multiprocessing import resource_tracker, shared_memory
from pathlib import Path

import numpy as np

from vla_scale.envs.types import ChunkStep, Observation, observation_of
from vla_scale.parallel.sim.slot_batch import SlotBatch

BLOCK_PREFIX = "vla_images_"
SHARED_MEMORY = Path("/dev/shm")


def remove_orphans(folder: Path = SHARED_MEMORY) -> list[str]:
    """Remove the image blocks whose maker process no longer exists (killed with its resource tracker); returns
    their names. Blocks of live processes, and everything not ours, are left alone."""
    removed = []
    for path in folder.glob(f"{BLOCK_PREFIX}*"):
        pid = path.name[len(BLOCK_PREFIX):].split("_")[0]
        if pid.isdigit() and not _alive(int(pid)):
            try:
                path.unlink()
                removed.append(path.name)
            except FileNotFoundError:
                pass
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ImageWriter:
    """Child side: one shared block per camera, [num_slots, H, W, 3] uint8."""

    def __init__(self, num_slots: int):
        self.num_slots = num_slots
        self.blocks: dict[str, tuple[shared_memory.SharedMemory, np.ndarray]] = {}

    def _block(self, camera: str, frame: tuple[int, ...]) -> tuple[shared_memory.SharedMemory, np.ndarray]:
        shape = (self.num_slots, *frame)
        held = self.blocks.get(camera)
        if held is None or held[1].shape != shape:
            if held is not None:
                held[0].close()
                held[0].unlink()
            name = f"{BLOCK_PREFIX}{os.getpid()}_{secrets.token_hex(4)}"
            shm = shared_memory.SharedMemory(name=name, create=True, size=int(np.prod(shape)))
            held = (shm, np.ndarray(shape, dtype=np.uint8, buffer=shm.buf))
            self.blocks[camera] = held
        return held

    def pack(self, kind: str, results: list[Observation | ChunkStep | None]) -> SlotBatch:
        """`SlotBatch.pack` with each answer's images written straight into its slot's rows (one copy, no stacked
        array in between); the batch keeps only where they are."""
        batch = SlotBatch.pack(kind, results, images=False)
        rows: dict[str, np.ndarray] = {}  # camera -> its block's rows, looked up once per camera
        for slot in batch.index.tolist():
            answer = results[slot]
            assert answer is not None
            for camera, image in observation_of(answer).images.items():
                if camera not in rows:
                    rows[camera] = self._block(camera, image.shape)[1]
                elif rows[camera].shape[1:] != image.shape:
                    raise ValueError(f"camera {camera!r} gave frames of shapes {rows[camera].shape[1:]} and "
                                     f"{image.shape} in one answer: every simulator of a process must render it at "
                                     "one size")
                rows[camera][slot] = image
        for camera, block in rows.items():
            batch.shared[camera] = (self.blocks[camera][0].name, block.shape)
            batch.images[camera] = np.empty((0, *block.shape[1:]), dtype=np.uint8)
        return batch

    def close(self) -> None:
        for shm, _ in self.blocks.values():
            shm.close()
            shm.unlink()
        self.blocks.clear()


class ImageReader:
    """Parent side: attaches to the child's blocks and copies the answered rows out.

    One block per camera: a block with a new name (the child was replaced, or the frame size changed) replaces the
    one held for that camera. Any process of the machine can read a child's answers this way, not only its parent:
    `foreign=True` for one that does not share the child's resource tracker (the child's parent and the child share
    it), so that it neither warns about nor removes at its exit blocks the child owns.
    """

    def __init__(self, foreign: bool = False) -> None:
        self.foreign = foreign
        self.blocks: dict[str, tuple[str, shared_memory.SharedMemory, np.ndarray]] = {}  # camera -> name, block, rows

    def attach(self, batch: SlotBatch) -> SlotBatch:
        """Attach to the batch's blocks (so `close(unlink=True)` can remove them) without reading them."""
        for camera, (name, shape) in batch.shared.items():
            self._rows(camera, name, shape)
        return batch

    def take(self, batch: SlotBatch) -> SlotBatch:
        for camera, (name, shape) in batch.shared.items():
            batch.images[camera] = self._rows(camera, name, shape)[batch.index]  # fancy indexing copies
        batch.shared = {}
        return batch

    def _rows(self, camera: str, name: str, shape: tuple[int, ...]) -> np.ndarray:
        held = self.blocks.get(camera)
        if held is None or held[0] != name:
            if held is not None:
                held[1].close()
            shm = shared_memory.SharedMemory(name=name)  # the child owns the block and unlinks it
            if self.foreign:
                resource_tracker.unregister("/" + shm.name, "shared_memory")  # POSIX names carry a leading slash
            held = (name, shm, np.ndarray(shape, dtype=np.uint8, buffer=shm.buf))
            self.blocks[camera] = held
        return held[2]

    def close(self, unlink: bool = False) -> None:
        """Detach; `unlink` also removes the blocks (when the child died and cannot; the child's parent only)."""
        for _, shm, _ in self.blocks.values():
            shm.close()
            if unlink and not self.foreign:
                try:
                    shm.unlink()
                except FileNotFoundError:
                    pass
        self.blocks.clear()
