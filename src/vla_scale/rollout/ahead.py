"""RolloutAhead: the next step's rollout played in a thread of its own while the actor's update runs
(`algo.max_staleness=1`).

The simulators step and the engine decodes while the update trains, instead of each waiting for the other. The step
then lasts as long as the longer of the two. On a GPU the decodes go to a stream of their own, of the highest
priority while the rollout is what the step waits for (`urgent`: the update's kernels yield to the decodes, and the
simulators wait on them about as little as they do alone) and of the update's own (the lowest) while the update is
(the decodes no longer go first, so they slow the update less; the rollout, hidden behind it, may take longer).
Nothing in the thread calls a collective (the caller averages over ranks once the rollout is back), the sampler and
the engine's generator are used by this thread only while it runs, and the weight sync waits for the rollout (`wait`)
before it writes: the engine holds one version for the whole rollout.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

import torch

T = TypeVar("T")


class RolloutAhead(Generic[T]):
    """At most one rollout in flight: `start(collect)` runs `collect()` in the rollout thread, `wait()` returns its
    result (re-raising what it raised) and the seconds it ran."""

    def __init__(self, device: torch.device):
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollout-ahead")
        on_gpu = device.type == "cuda"
        self._streams = {urgent: torch.cuda.Stream(device, priority=-1 if urgent else 0) for urgent in (True, False)
                         } if on_gpu else {}
        self._future: Future[tuple[T, float]] | None = None

    @property
    def in_flight(self) -> bool:
        return self._future is not None

    def start(self, collect: Callable[[], T], urgent: bool = True) -> None:
        """`collect()` in the rollout thread; `urgent`: its decodes before the update's kernels (on a GPU)."""
        if self._future is not None:
            raise RuntimeError("a rollout is already in flight: wait() for it before starting the next")
        self._future = self._pool.submit(self._run, collect, self._streams.get(urgent))

    @staticmethod
    def _run(collect: Callable[[], T], stream: torch.cuda.Stream | None) -> tuple[T, float]:
        start = time.perf_counter()
        if stream is None:
            return collect(), time.perf_counter() - start
        with torch.cuda.stream(stream):
            result = collect()
        stream.synchronize()
        return result, time.perf_counter() - start

    def wait(self) -> tuple[T, float]:
        """The rollout's result and its wall seconds, once it has ended (its exception, if it raised one)."""
        if self._future is None:
            raise RuntimeError("no rollout in flight")
        future, self._future = self._future, None
        return future.result()

    def close(self) -> None:
        """Let a rollout in flight end (its result dropped), then stop the thread."""
        if self._future is not None:
            self._future.exception()
            self._future = None
        self._pool.shutdown(wait=True)
