"""One simulator subprocess hosting `num_slots` envs, driven over a socket pair with split send/recv halves.

The child is a fresh interpreter running this module's `_child_entry` (`python -c`, the parent's `sys.path` first),
connected over a socket pair, and builds its envs itself (`make_env` runs in the child), so no GL/EGL state is
inherited. Unlike a multiprocessing "spawn" child it does not import the parent's main module: a simulator started
from a script that imports torch at the top does not load torch too. It shares the parent's shared-memory resource
tracker, as a spawned child would. It sets MUJOCO_GL=egl when unset, before anything imports mujoco; this module
imports neither mujoco nor torch.

Rendering on the CPU: Mesa's llvmpipe, the EGL renderer of machines without a GPU, starts one rasterizer thread per
CPU the process may run on and hands every frame to them. A fleet already runs many simulator processes per core,
so those threads only add hand-overs and context switches (measured in docs/performance.md). A child therefore
renders in its own thread (LP_NUM_THREADS=0) unless the caller has set LP_NUM_THREADS. Other renderers ignore it.
It also starts with a larger glibc cache of freed memory (`_child_environment`).

Protocol (parent -> child): ("reset", tasks, active) | ("step", chunks, active) | ("close",); slots whose `active`
flag is off are left alone and answer None. Child -> parent: ("ok", SlotBatch, cpu_seconds) | ("error", traceback
text, cpu_seconds). Requests are answered exactly once, in the order they were sent, so several may be in flight
(one per pipeline stage); `cpu_seconds` is the child's CPU time spent on the request (simulator busy time).

The halves let a caller fan out to many processes and then gather:

    for p in procs: p.send_step(chunks[p], active[p])
    results = [p.recv(timeout_s=5.0) for p in procs]

Faults: a deadline that expires or a child that dies raises SimulatorError and leaves the process `broken` (its
pipe may still carry a late answer), so the caller closes it and starts a new one. An exception raised by an env
inside the child also raises SimulatorError (with the child traceback) but the process stays usable.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import time
import traceback
import weakref
from collections import deque
from collections.abc import Mapping
from multiprocessing import resource_tracker
from multiprocessing.connection import Connection
from typing import Any, Self

import numpy as np

from vla_scale.envs.types import ChunkStep, Observation, TaskSpec
from vla_scale.parallel.sim.shared_images import ImageReader, ImageWriter
from vla_scale.parallel.sim.slot_batch import SlotBatch


class SimulatorError(RuntimeError):
    """A simulator process failed: it died, missed its deadline, or an env raised inside it."""


def _child_main(conn: Connection, env_name: str, env_kwargs: dict[str, Any], num_slots: int) -> None:
    """Serve requests until "close" or until the parent end of the pipe goes away."""
    os.environ.setdefault("MUJOCO_GL", "egl")
    os.environ.setdefault("LP_NUM_THREADS", "0")  # llvmpipe: no rasterizer threads (see the module docstring)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the parent, which closes its children
    envs: list[Any] = []
    images = ImageWriter(num_slots)
    boot_error = None
    try:
        from vla_scale.envs.registry import make_env

        envs = [make_env(env_name, **env_kwargs) for _ in range(num_slots)]
    except Exception:  # noqa: BLE001 - reported to the parent on its first request
        boot_error = traceback.format_exc()
    try:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                break
            if message[0] == "close":
                break
            if boot_error is not None:
                conn.send(("error", f"building env {env_name!r} failed:\n{boot_error}", 0.0))
                continue
            start = time.process_time()
            try:
                payload = images.pack(message[0], _serve(envs, message))
            except Exception:  # noqa: BLE001 - any env failure is sent back and re-raised in the parent
                conn.send(("error", traceback.format_exc(), time.process_time() - start))
                continue
            conn.send(("ok", payload, time.process_time() - start))
    finally:
        for env in envs:
            env.close()
        images.close()
        conn.close()


def _serve(envs: list[Any], message: tuple) -> list[Any]:
    kind = message[0]
    if kind == "reset":
        tasks, active = message[1], message[2]
        return [env.reset(task) if on else None for env, task, on in zip(envs, tasks, active, strict=True)]
    if kind == "step":
        chunks, active = message[1], message[2]
        return [env.step(chunk) if on else None for env, chunk, on in zip(envs, chunks, active, strict=True)]
    raise ValueError(f"unknown request {kind!r}")


def _child_entry(fd: int, tracker_fd: int) -> None:
    """The child program: adopt the parent's resource tracker, read what to build, serve."""
    resource_tracker._resource_tracker._fd = tracker_fd  # as a spawned child does: register with the parent's tracker
    conn = Connection(fd)
    env_name, env_kwargs, num_slots = conn.recv()
    _child_main(conn, env_name, env_kwargs, num_slots)


TCACHE_COUNT = "glibc.malloc.tcache_count=256"


def _child_environment(changes: Mapping[str, str | None] | None = None) -> dict[str, str]:
    """The parent's environment with `changes` (None removes a variable; e.g. the EGL device to render on,
    `render_device.render_environment`), and glibc's per-thread cache of freed chunks raised to 256 per size.

    A request's answers (their records, small arrays and dicts) are freed together once packed. glibc's cache keeps
    only 7 chunks of a size by default, so the rest went to its bins, and the envs' next allocations took the slow
    path: `_int_malloc` was the largest cost the fleet added to a simulator process against a plain stepping loop in
    the same process (docs/performance.md). A caller's own `GLIBC_TUNABLES` is kept, and so is its tcache_count;
    other C libraries ignore the variable."""
    env = dict(os.environ)
    for key, value in (changes or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    tunables = env.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.tcache_count" not in tunables:
        env["GLIBC_TUNABLES"] = f"{tunables}:{TCACHE_COUNT}" if tunables else TCACHE_COUNT
    return env


def _start_child(env_name: str, env_kwargs: dict[str, Any], num_slots: int,
                 environment: Mapping[str, str | None] | None = None) -> tuple[subprocess.Popen, Connection]:
    """A fresh interpreter serving over one end of a socket pair; returns it and the parent's end."""
    ours, theirs = socket.socketpair()
    resource_tracker.ensure_running()
    tracker_fd = resource_tracker._resource_tracker._fd
    assert tracker_fd is not None
    code = (f"import sys; sys.path[:0] = {sys.path!r}; "
            f"from vla_scale.parallel.sim.process import _child_entry; _child_entry({theirs.fileno()}, {tracker_fd})")
    try:
        child = subprocess.Popen([sys.executable, "-c", code], pass_fds=(theirs.fileno(), tracker_fd),
                                 env=_child_environment(environment))
    finally:
        theirs.close()  # the child holds its own copy: the parent sees EOF when the child dies
    conn = Connection(ours.detach())
    conn.send((env_name, env_kwargs, num_slots))
    return child, conn


_open: weakref.WeakSet[SimProcess] = weakref.WeakSet()


@atexit.register
def _close_open_processes() -> None:
    """At interpreter exit, close simulators still open (a child hung in a step would not notice the exit)."""
    for proc in list(_open):
        proc.close(timeout_s=0.5)


class SimProcess:
    """A subprocess running `num_slots` instances of env `env_name`; requests are answered in order."""

    def __init__(self, env_name: str, num_slots: int = 1, env_kwargs: dict[str, Any] | None = None,
                 boot_timeout_s: float = 120.0, environment: Mapping[str, str | None] | None = None) -> None:
        """`boot_timeout_s`: the deadline of the first answer, which includes starting the child and its envs;
        `environment`: variables the child's environment sets (a string) or removes (None)."""
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        self.env_name = env_name
        self.num_slots = num_slots
        self.env_kwargs = dict(env_kwargs or {})
        self._process, self._conn = _start_child(env_name, self.env_kwargs, num_slots, environment)
        self._pending: deque[str] = deque()
        self._booted = False
        self._images = ImageReader()
        self.boot_timeout_s = boot_timeout_s
        self.busy_s = 0.0
        self.broken = False
        self.failure: str | None = None  # what broke it (a later call's error names it)
        self._closed = False
        _open.add(self)

    @property
    def pid(self) -> int:
        return self._process.pid

    def is_alive(self) -> bool:
        return not self._closed and self._process.poll() is None

    def _describe(self, call: str | None) -> str:
        return f"simulator pid={self.pid} env={self.env_name!r} call={call!r}"

    def _fail(self, call: str | None, why: str) -> SimulatorError:
        self.broken = True
        self._pending.clear()
        self.failure = f"{self._describe(call)}: {why}"
        return SimulatorError(self.failure)

    def _send(self, call: str, message: tuple) -> None:
        if self._closed or self.broken:
            raise SimulatorError(f"{self._describe(call)}: process is {'closed' if self._closed else 'broken'}")
        try:
            self._conn.send(message)
        except (BrokenPipeError, OSError) as exc:
            raise self._fail(call, f"child is gone (exitcode={self._process.poll()}): {exc!r}") from exc
        self._pending.append(call)

    @property
    def pending(self) -> int:
        """Requests sent and not yet answered."""
        return len(self._pending)

    def send_reset(self, tasks: list[TaskSpec | None], active: np.ndarray | None = None) -> None:
        """Start resetting the active slots (default: all) to their tasks; collect the observations with recv()."""
        if len(tasks) != self.num_slots:
            raise ValueError(f"need one task per slot ({self.num_slots}), got {len(tasks)}")
        mask = np.ones(self.num_slots, dtype=bool) if active is None else np.asarray(active, dtype=bool)
        if any(task is None for task, on in zip(tasks, mask, strict=True) if on):
            raise ValueError("every active slot needs a task")
        self._send("reset", ("reset", list(tasks), mask))

    def send_step(self, chunks: np.ndarray, active: np.ndarray) -> None:
        """Start stepping the active slots with their chunks [num_slots, T, A]; inactive slots answer None."""
        chunks = np.asarray(chunks)
        active = np.asarray(active, dtype=bool)
        if chunks.ndim != 3 or chunks.shape[0] != self.num_slots:
            raise ValueError(f"chunks must have shape [{self.num_slots}, T, A], got {chunks.shape}")
        if active.shape != (self.num_slots,):
            raise ValueError(f"active must have shape [{self.num_slots}], got {active.shape}")
        self._send("step", ("step", chunks, active))

    def recv(self, timeout_s: float) -> list[Observation | None] | list[ChunkStep | None]:
        """The answer to the oldest pending request, one record per slot."""
        return self.recv_batch(timeout_s).unpack()

    def _recv(self, timeout_s: float) -> Any:
        """The payload of the answer to the oldest pending request (the deadline as in `recv_batch`)."""
        if not self._pending:
            raise RuntimeError(f"{self._describe(None)}: recv() without a pending request")
        call = self._pending[0]
        if not self._booted:
            timeout_s = max(timeout_s, self.boot_timeout_s)
        deadline = time.monotonic() + timeout_s
        try:
            ready = self._conn.poll(max(0.0, deadline - time.monotonic()))
            if not ready:
                raise self._fail(call, f"no answer within {timeout_s:.3f}s (alive={self.is_alive()})")
            status, payload, busy_s = self._conn.recv()
        except (EOFError, OSError) as exc:
            self._wait(1.0)
            raise self._fail(call, f"child died (exitcode={self._process.poll()})") from exc
        self._pending.popleft()
        self._booted = True
        self.busy_s += busy_s
        if status == "error":
            raise SimulatorError(f"{self._describe(call)}: raised in the child:\n{payload}")
        return payload

    def recv_batch(self, timeout_s: float, copy_images: bool = True) -> SlotBatch:
        """The answer to the oldest pending request, packed, waiting at most timeout_s seconds.

        `copy_images=False` leaves the camera images in the child's shared memory (`batch.shared` says where) for
        another process of this machine to copy out with an `ImageReader`; it must do so before the next request
        to these slots is sent.
        """
        payload = self._recv(timeout_s)
        return self._images.take(payload) if copy_images else self._images.attach(payload)

    def _wait(self, timeout_s: float | None) -> bool:
        """Wait for the child to exit (None: for good); whether it has."""
        try:
            self._process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    def close(self, timeout_s: float = 2.0) -> None:
        """Ask the child to exit; terminate, then kill it if it does not within timeout_s (a broken one: kill)."""
        if self._closed:
            return
        self._closed = True
        _open.discard(self)
        exited = self._process.poll() is not None
        if not self.broken and not exited:
            try:
                self._conn.send(("close",))
            except (BrokenPipeError, OSError):
                pass
            exited = self._wait(timeout_s)
        if not exited and not self.broken:
            self._process.terminate()
            exited = self._wait(0.5)
        if not exited:  # a broken child may be hung or stopped: SIGKILL at once
            self._process.kill()
            self._wait(None)
        # a child that did not exit by itself (broken, killed, terminated) could not remove its image blocks
        self._images.close(unlink=self.broken or self._process.returncode != 0)
        self._conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
