"""Preemption: SIGTERM (what cluster schedulers send before they stop a job) asks the trainer to stop after the
current step; a second SIGTERM stops it at once, as SIGINT always does.

The handler is installed once Ray and the simulators have started, so it replaces the one Ray's driver installs
(which aborts the process). Simulator processes keep their own handling; the trainer closes them as it exits.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType


class Preempted(Exception):
    """The run stopped at a SIGTERM after saving a checkpoint; the message says how to resume it."""


EXIT_CODE = 143
"""What launch/train.py exits with after a preemption (128 + SIGTERM, as a process terminated by it)."""


class StopSignals:
    """Counts SIGTERMs while installed: `requested` after the first; the second raises KeyboardInterrupt."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: object = None

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():  # Python handles signals on the main thread
            self._previous = signal.signal(signal.SIGTERM, self._handle)

    def uninstall(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)  # type: ignore[arg-type]
            self._previous = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            raise KeyboardInterrupt("a second SIGTERM: stopping at once")
        self.requested = True
        print("SIGTERM received: finishing this step, then saving a checkpoint (send it again to stop at once)",
              flush=True)
