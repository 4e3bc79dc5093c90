"""The simulator fleet: sim workers, each running its simulators in subprocesses, answering per pipeline stage.

Layout: a trainer rank drives `parallel.num_workers` sim workers (`SimWorker`); each runs `parallel.sims_per_worker`
`SimProcess`es; each process hosts `slots` simulators. Fleet slot f lives in worker f // per_worker, process
(f % per_worker) // slots, local slot f % slots. With S pipeline stages every process hosts slots of every stage:
local slots [s*m, (s+1)*m), m = slots / S, belong to stage s, so each stage keeps every process busy.

Requests are answered in the order they were sent (one request per stage may be in flight), and `recv()` returns
the oldest one. A worker sends each request to all its processes before it waits for any. Sending and receiving
run on separate threads (each in call order), so a receive that waits for one stage's simulators never holds back
another stage's chunks; a lock keeps the two threads' views of the processes consistent.

Placement, one interface with two implementations: in colocated mode the workers are by default plain objects inside
the trainer's process (`LocalWorkers`): a send writes to the simulators' pipes in the caller's thread and a receive
runs on the worker's own background thread, so a stage hand-over is a pipe write and read with no Ray call (such a
fleet makes none at all; a send waits only while its worker replaces a failed process). Otherwise (disaggregated
mode, or `in_process=False`) they are Ray actors (`RayWorkers`) whose sends and receives are two concurrency groups
of one thread each. Camera images travel from a simulator process's shared memory to whoever reads them: a worker
on the trainer's machine passes on only where they are and the fleet copies them out itself; a worker on another
node (disaggregated mode) copies them into its reply.

Faults: a process that dies, misses its deadline or raises is closed and replaced; its running episodes are reset
to their initial states and reported as `Restarted` (the env loop starts them again), also for slots the trainer
was still deciding on. Each replacement travels back with the worker's reply, naming the worker, the process and the
cause, and the fleet logs it as a warning in the trainer's process (the console and the run's log file, wherever the
worker runs). After `max_failures` failures in a row of one process the worker raises `SimulatorError` naming the
worker, process and tasks. Neither this module nor the sim workers import torch.
"""

from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray

from vla_scale.envs.types import ChunkStep, Observation, TaskSpec
from vla_scale.parallel.sim.process import SimProcess, SimulatorError
from vla_scale.parallel.sim.shared_images import ImageReader, remove_orphans
from vla_scale.parallel.sim.slot_batch import SlotBatch
from vla_scale.process_memory import rss_bytes

log = logging.getLogger(__name__)


@dataclass
class Restarted:
    """The slot's simulator was restarted: its episode begins again from this initial observation."""

    observation: Observation


SlotResult = Observation | ChunkStep | Restarted | None


@dataclass
class WorkerReply:
    """A worker's answer to one request: packed slot results per process plus the slots whose episodes start again.

    A part whose `shared` is set left its camera images in that simulator process's shared memory (the caller is on
    the same machine and copies them out itself, see `SimFleet.collect`).
    """

    parts: list[SlotBatch]
    restarted: dict[int, Observation]
    busy_s: float  # simulator CPU seconds spent on this request
    restarts: int
    replaced: list[str] = field(default_factory=list)  # one line per process replaced since the last reply


@dataclass(frozen=True)
class WorkerSpec:
    """What every sim worker of a fleet is built with (the same for each; a worker adds its index)."""

    env_name: str
    env_kwargs: dict[str, Any]  # what every simulator is built with (`make_env`)
    sims: int  # simulator processes of one worker
    slots: int  # simulators of one process
    timeout_s: float  # deadline of every call to a simulator process
    max_failures: int  # restarts of one process before the run stops
    boot_timeout_s: float  # deadline of a process's start
    environment: dict[str, str | None] = field(default_factory=dict)  # set (str) or removed (None) in each process


class SimWorker:
    """Owns `sims` simulator processes of `slots` simulators each; a Ray actor or a plain object of the trainer.

    Sends and receives may come from two threads (a Ray actor's two concurrency groups, or the caller's thread and
    the fleet's receive thread for a worker in the trainer's process).
    """

    CONCURRENCY_GROUPS = {"send": 1, "recv": 1}

    def __init__(self, index: int, spec: WorkerSpec):
        self.index, self.env_name, self.env_kwargs = index, spec.env_name, spec.env_kwargs
        self.slots, self.timeout_s, self.max_failures = spec.slots, spec.timeout_s, spec.max_failures
        self.boot_timeout_s, self.environment = spec.boot_timeout_s, spec.environment
        self.procs = [self._spawn() for _ in range(spec.sims)]
        size = spec.sims * spec.slots
        self.tasks: list[TaskSpec | None] = [None] * size
        self.running = np.zeros(size, dtype=bool)
        self.lost: dict[int, Observation] = {}  # slot -> initial observation after a restart, not yet reported
        self.orphaned = [0] * spec.sims  # requests lost with a replaced process, still to be answered
        self.failures = [0] * spec.sims
        self.replaced: list[str] = []  # replacements not yet reported (`WorkerReply.replaced`)
        self.requests: queue.Queue[tuple[str, np.ndarray]] = queue.Queue()
        self.lock = threading.Lock()
        self.closed = False

    def _spawn(self) -> SimProcess:
        return SimProcess(self.env_name, self.slots, self.env_kwargs, boot_timeout_s=self.boot_timeout_s,
                          environment=self.environment)

    def _part(self, k: int) -> slice:
        return slice(k * self.slots, (k + 1) * self.slots)

    @ray.method(concurrency_group="send")
    def send_reset(self, tasks: list[TaskSpec | None], mask: np.ndarray) -> None:
        with self.lock:
            for j in np.flatnonzero(mask):
                self.tasks[j], self.running[j] = tasks[j], True
                self.lost.pop(int(j), None)
            self._send("reset", mask, lambda proc, part: proc.send_reset(tasks[part], mask[part]))

    @ray.method(concurrency_group="send")
    def send_step(self, chunks: np.ndarray, mask: np.ndarray) -> None:
        with self.lock:
            live = mask.copy()
            live[list(self.lost)] = False  # lost slots are answered with Restarted, not stepped
            self._send("step", mask, lambda proc, part: proc.send_step(chunks[part], live[part]))

    def _send(self, kind: str, mask: np.ndarray, send) -> None:
        """Forward a request to every process, then queue it for recv() (caller holds the lock)."""
        for k, proc in enumerate(self.procs):
            try:
                send(proc, self._part(k))
            except SimulatorError:
                pass  # the process is gone: recv() finds out and replaces it
        self.requests.put((kind, mask.copy()))

    @ray.method(concurrency_group="recv")
    def recv(self, copy_images: bool = True) -> WorkerReply:
        """Answer the oldest request; replace any process that fails on the way.

        `copy_images=False` (a caller on this machine): camera images stay in shared memory and only where they are
        travels, which spares a copy here, the object store and a copy out of it.
        """
        kind, mask = self.requests.get(timeout=self.boot_timeout_s + self.timeout_s)
        parts: list[SlotBatch] = []
        busy = 0.0
        restarts = 0
        unanswered = SlotBatch.pack(kind, [None] * self.slots)  # a replaced or skipped process's part
        for k in range(len(self.procs)):
            part = unanswered
            with self.lock:
                proc = self.procs[k]
                skip = self.orphaned[k] > 0
                self.orphaned[k] -= skip
            if not skip:
                before = proc.busy_s
                try:
                    if proc.broken or not proc.pending:  # its send failed: the cause is the send's
                        raise SimulatorError(proc.failure or f"simulator pid={proc.pid} env={self.env_name!r}: "
                                             "process is broken")
                    part = proc.recv_batch(self.timeout_s, copy_images)
                    self.failures[k] = 0
                    busy += proc.busy_s - before
                except SimulatorError as err:
                    with self.lock:
                        self.orphaned[k] = self.requests.qsize()  # later requests were lost with it too
                        self._replace(k, err)
                    restarts += 1
            parts.append(part)
        with self.lock:
            if kind == "step":
                for k, part in enumerate(parts):
                    self.running[k * self.slots + part.index[part.done]] = False
            restarted = {int(j): self.lost.pop(int(j)) for j in np.flatnonzero(mask) if int(j) in self.lost}
            replaced, self.replaced = self.replaced, []
        return WorkerReply(parts, restarted, busy, restarts, replaced)

    def _replace(self, k: int, err: SimulatorError) -> None:
        """Start a fresh process for slots of process k and reset its running episodes to their initial states."""
        part = self._part(k)
        while True:
            if self.closed:  # a receive still running when the worker was closed starts nothing new
                raise SimulatorError(f"sim worker {self.index} is closed; last error: {err}")
            self.failures[k] += 1
            tasks = [t for t, on in zip(self.tasks[part], self.running[part], strict=True) if on]
            if self.failures[k] >= self.max_failures:
                raise SimulatorError(
                    f"sim worker {self.index} process {k} ({self.env_name}) failed {self.failures[k]} times in a "
                    f"row, running tasks {tasks}; last error: {err}"
                )
            self.procs[k].close()
            self.procs[k] = self._spawn()
            self.replaced.append(self._report(k, err, len(tasks)))
            mask = self.running[part].copy()
            if not mask.any():
                return
            try:
                self.procs[k].send_reset(self.tasks[part], mask)
                observations = self.procs[k].recv(self.timeout_s)
            except SimulatorError as again:
                err = again
                continue
            for local in np.flatnonzero(mask):
                self.lost[part.start + int(local)] = observations[local]
            return

    def _report(self, k: int, err: SimulatorError, episodes: int) -> str:
        """The line that says process k was replaced, why (the error names the old process's pid), and what it
        costs."""
        return (f"sim worker {self.index} process {k} ({self.env_name}) replaced by pid "
                f"{self.procs[k].pid}: {failure_cause(err)}; its {episodes} running episode(s) start again from their "
                f"initial states ({self.failures[k]} failure(s) in a row; parallel.max_failures={self.max_failures} "
                "stop the run)")

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def pids(self) -> list[int]:
        return [proc.pid for proc in self.procs]

    def rss(self) -> list[int]:
        """The resident set of each of its simulator processes in bytes, read on the node they run on."""
        return [rss_bytes(pid) for pid in self.pids()]

    def close(self) -> None:
        with self.lock:
            self.closed = True
            for proc in self.procs:
                proc.close()


def failure_cause(err: Exception) -> str:
    """`err`'s message on one line: a child's traceback shortened to its last line (the exception raised)."""
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    traceback = next((i for i, line in enumerate(lines) if line.startswith("Traceback")), None)
    if traceback is not None:
        lines = [*lines[:traceback], lines[-1]]
    return " ".join(lines)


@dataclass
class FleetStats:
    busy_s: float = 0.0
    restarts: int = 0


class LocalWorkers:
    """Sim workers as plain objects of this process: a send is a direct call (it writes to the simulators' pipes in
    the caller's thread), and each worker receives on a thread of its own, so its answers come in call order and
    never hold back a send. No Ray call at all."""

    foreign = False  # the simulators share this process's resource tracker

    def __init__(self, count: int, spec: WorkerSpec):
        self.workers = [SimWorker(i, spec) for i in range(count)]
        self.receivers = [ThreadPoolExecutor(1, thread_name_prefix=f"sim-worker-{i}-recv") for i in range(count)]
        self.local = [True] * count

    def send(self, i: int, method: str, *args: Any) -> None:
        getattr(self.workers[i], method)(*args)

    def ask_recv(self) -> list[Future[WorkerReply]]:
        return [receiver.submit(worker.recv, not local)
                for worker, receiver, local in zip(self.workers, self.receivers, self.local, strict=True)]

    def replies(self, handles: list[Future[WorkerReply]]) -> list[WorkerReply]:
        return [h.result() for h in handles]

    def each(self, method: str) -> list[Any]:
        return [getattr(worker, method)() for worker in self.workers]

    def close(self) -> None:
        for receiver in self.receivers:  # receives asked for and not begun are dropped; a running one ends below
            receiver.shutdown(wait=False, cancel_futures=True)
        self.each("close")


class SimNodeLost(RuntimeError):
    """A sim worker's Ray actor is gone (its node died or its process was killed): its simulators' episodes of this
    rollout cannot be finished."""


class RayWorkers:
    """Sim workers as Ray actors (no CPU slot; with `sim_resource` only on nodes offering `sim`), their sends and
    receives two concurrency groups of one thread each. A worker on another node copies its images into its reply.
    A worker whose actor died raises `SimNodeLost` naming it and its node."""

    foreign = True

    def __init__(self, count: int, spec: WorkerSpec, sim_resource: bool):
        options: dict[str, Any] = {"num_cpus": 0, "concurrency_groups": SimWorker.CONCURRENCY_GROUPS}
        if sim_resource:
            options["resources"] = {"sim": 0.001}
        remote = ray.remote(**options)(SimWorker)
        self.workers = [remote.remote(i, spec) for i in range(count)]
        here = ray.get_runtime_context().get_node_id()
        self.nodes = self.each("node_id")
        self.local = [node == here for node in self.nodes]

    def send(self, i: int, method: str, *args: Any) -> None:
        getattr(self.workers[i], method).remote(*args)

    def ask_recv(self) -> list[ray.ObjectRef]:
        return [worker.recv.remote(not local) for worker, local in zip(self.workers, self.local, strict=True)]

    def replies(self, handles: list[ray.ObjectRef]) -> list[WorkerReply]:
        return self._get(handles)

    def each(self, method: str) -> list[Any]:
        return self._get([getattr(worker, method).remote() for worker in self.workers])

    def _get(self, handles: list[ray.ObjectRef]) -> list[Any]:
        """Every worker's answer, in order; `SimNodeLost` for the first whose actor died."""
        answers = []
        for i, handle in enumerate(handles):
            try:
                answers.append(ray.get(handle))
            except ray.exceptions.RayActorError as err:
                node = self.nodes[i] if hasattr(self, "nodes") else "unknown"
                raise SimNodeLost(f"sim worker {i} on Ray node {node} is gone ({type(err).__name__}): its node "
                                  "died or its process was killed") from err
        return answers

    def close(self) -> None:
        try:
            self.each("close")
        except SimNodeLost:
            pass  # a lost worker has nothing left to close; the others are killed below
        finally:
            for worker in self.workers:
                ray.kill(worker)


class SimFleet:
    """`size` simulators over `num_workers` sim workers, split into `stages` pipeline stages.

    `send_reset`/`send_step` take full-size arrays with a mask of the slots concerned; `recv()` answers the oldest
    request with one entry per slot (None outside its mask). The workers run inside this process (`LocalWorkers`,
    `in_process=True`) or as Ray actors (`RayWorkers`); with `sim_resource` (disaggregated mode) they are always Ray
    actors on simulation nodes. `environment`: variables each simulator process sets or removes (None), e.g. the
    EGL device it renders on.
    """

    def __init__(self, env_name: str, env_kwargs: dict[str, Any], size: int, num_workers: int, sims_per_worker: int,
                 timeout_s: float, stages: int = 1, max_failures: int = 3, sim_resource: bool = False,
                 boot_timeout_s: float = 120.0, in_process: bool = True,
                 environment: dict[str, str | None] | None = None):
        per_proc, rest = divmod(size, num_workers * sims_per_worker * stages)
        if rest or per_proc == 0:
            raise ValueError(f"{size} simulators do not divide over {num_workers} workers x {sims_per_worker} "
                             f"processes x {stages} stages")
        self.size, self.per_worker, self.stages = size, size // num_workers, stages
        self.env_kwargs = env_kwargs  # what every simulator is built with (`make_env`)
        self.slots = size // (num_workers * sims_per_worker)
        self.num_procs = num_workers * sims_per_worker
        spec = WorkerSpec(env_name, env_kwargs, sims_per_worker, self.slots, timeout_s, max_failures, boot_timeout_s,
                          dict(environment or {}))
        self.workers: LocalWorkers | RayWorkers = (
            LocalWorkers(num_workers, spec) if in_process and not sim_resource
            else RayWorkers(num_workers, spec, sim_resource))
        self.readers = [[ImageReader(foreign=self.workers.foreign) for _ in range(sims_per_worker)]
                        for _ in range(num_workers)]
        self.stats = FleetStats()

    def slot_stages(self) -> np.ndarray:
        """Stage of every fleet slot."""
        per_stage = self.slots // self.stages
        return (np.arange(self.size) % self.slots) // per_stage

    def _split(self, array: Any, i: int) -> Any:
        return array[i * self.per_worker : (i + 1) * self.per_worker]

    def _send(self, method: str, data: Any, mask: np.ndarray) -> None:
        for i in range(len(self.workers.local)):
            self.workers.send(i, method, self._split(data, i), self._split(mask, i))

    def send_reset(self, tasks: list[TaskSpec | None], mask: np.ndarray) -> None:
        self._send("send_reset", tasks, mask)

    def send_step(self, chunks: np.ndarray, mask: np.ndarray) -> None:
        self._send("send_step", chunks, mask)

    def request_recv(self) -> list[ray.ObjectRef | Future[WorkerReply]]:
        """Ask every worker for its answer to the oldest request, without waiting (see `collect`)."""
        return self.workers.ask_recv()

    def recv(self) -> list[SlotResult]:
        return self.collect(self.request_recv())

    def collect(self, handles: list) -> list[SlotResult]:
        """Wait for the answers asked for by `request_recv`; one entry per slot."""
        results: list[SlotResult] = []
        for i, reply in enumerate(self.workers.replies(handles)):
            self.stats.busy_s += reply.busy_s
            self.stats.restarts += reply.restarts
            for line in reply.replaced:
                log.warning(line)
            part: list[SlotResult] = []
            for reader, batch in zip(self.readers[i], reply.parts, strict=True):
                part.extend(reader.take(batch).unpack())
            for slot, observation in reply.restarted.items():
                part[slot] = Restarted(observation)
            results.extend(part)
            assert len(part) == self.per_worker, (i, len(part))
        return results

    def pids(self) -> list[int]:
        """Process ids of the simulator processes."""
        return [pid for part in self.workers.each("pids") for pid in part]

    def rss(self) -> list[int]:
        """The resident set of every simulator process in bytes (`SimWorker.rss`)."""
        return [size for part in self.workers.each("rss") for size in part]

    def close(self) -> None:
        try:
            self.workers.close()
        finally:
            for reader in (r for row in self.readers for r in row):
                reader.close()
            remove_orphans()  # the image blocks of simulators killed with their whole process tree
