"""Camera images passed from a simulator process to its parent through shared memory.

A pipe moves a request's images only while the parent reads (the child blocks once the socket buffer is full),
which made the hand-over cost as much as the simulation. Instead every slot owns a fixed row of a shared block per
camera: the child writes the rows it answers, the pipe carries only the block's name and the slot indices, and the
parent copies the rows out when it receives the answer. A slot's row is written again only after its next request,
which the parent sends after it has received this answer, so a row is never overwritten while still unread.
"""

from __future__ import annotations

from multiprocessing import shared_memory

import numpy as np

from vla_scale.envs.types import SlotBatch


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
            shm = shared_memory.SharedMemory(create=True, size=int(np.prod(shape)))
            held = (shm, np.ndarray(shape, dtype=np.uint8, buffer=shm.buf))
            self.blocks[camera] = held
        return held

    def put(self, batch: SlotBatch) -> SlotBatch:
        """Move the batch's images into shared memory; the batch keeps only where they are."""
        for camera, images in list(batch.images.items()):
            shm, rows = self._block(camera, images.shape[1:])
            rows[batch.index] = images
            batch.shared[camera] = (shm.name, rows.shape)
            batch.images[camera] = images[:0]
        return batch

    def close(self) -> None:
        for shm, _ in self.blocks.values():
            shm.close()
            shm.unlink()
        self.blocks.clear()


class ImageReader:
    """Parent side: attaches to the child's blocks and copies the answered rows out."""

    def __init__(self) -> None:
        self.blocks: dict[str, tuple[shared_memory.SharedMemory, np.ndarray]] = {}

    def take(self, batch: SlotBatch) -> SlotBatch:
        for camera, (name, shape) in batch.shared.items():
            held = self.blocks.get(name)
            if held is None:
                shm = shared_memory.SharedMemory(name=name)  # the child owns the block and unlinks it
                held = (shm, np.ndarray(shape, dtype=np.uint8, buffer=shm.buf))
                self.blocks[name] = held
            batch.images[camera] = held[1][batch.index]  # fancy indexing copies
        batch.shared = {}
        return batch

    def close(self, unlink: bool = False) -> None:
        """Detach; `unlink` also removes the blocks (when the child died and cannot)."""
        for shm, _ in self.blocks.values():
            shm.close()
            if unlink:
                try:
                    shm.unlink()
                except FileNotFoundError:
                    pass
        self.blocks.clear()
