"""SimProcess against a real spawned child: same results as in-process, deadlines, dead children, clean close."""

from __future__ import annotations

import os

os.environ.setdefault("MUJOCO_GL", "egl")

import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from vla_scale.envs.reach import ACTION_DIM, CAMERA, ReachEnv
from vla_scale.envs.types import ChunkStep, TaskSpec
from vla_scale.parallel.sim.process import SimProcess, SimulatorError, _child_environment
from vla_scale.parallel.sim.shared_images import ImageReader

BOOT_TIMEOUT_S = 60.0  # the first answer includes the child's interpreter start and imports
CHUNK = 8


def assert_gone(pid: int) -> None:
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_subprocess_matches_in_process_env() -> None:
    tasks = [TaskSpec("reach", 0, 4), TaskSpec("reach", 2, 9)]
    chunks = np.random.default_rng(1).uniform(-1, 1, (3, len(tasks), CHUNK, ACTION_DIM))
    active = np.array([True, False])
    local = [ReachEnv(camera_resolution=32) for _ in tasks]
    with SimProcess("reach", num_slots=len(tasks), env_kwargs={"camera_resolution": 32}) as proc:
        assert proc.is_alive() and proc.pid != os.getpid()
        proc.send_reset(tasks)
        remote_obs = proc.recv(timeout_s=BOOT_TIMEOUT_S)
        for env, task, obs in zip(local, tasks, remote_obs, strict=True):
            expected = env.reset(task)
            assert np.array_equal(obs.images[CAMERA], expected.images[CAMERA])
            assert np.array_equal(obs.proprio, expected.proprio) and obs.instruction == expected.instruction
        for step_chunks in chunks:
            proc.send_step(step_chunks, active)
            results = proc.recv(timeout_s=10.0)
            assert results[1] is None
            got = results[0]
            assert isinstance(got, ChunkStep)
            expected_step = local[0].step(step_chunks[0])
            assert np.array_equal(got.observation.images[CAMERA], expected_step.observation.images[CAMERA])
            assert np.array_equal(got.observation.proprio, expected_step.observation.proprio)
            assert (got.reward, got.done, got.success, got.steps_taken) == (
                expected_step.reward,
                expected_step.done,
                expected_step.success,
                expected_step.steps_taken,
            )
            if got.done:
                break
        pid = proc.pid
    assert not proc.is_alive()
    assert_gone(pid)
    for env in local:
        env.close()


def test_images_left_in_shared_memory_read_the_same_from_another_reader() -> None:
    tasks = [TaskSpec("reach", 1, 3), TaskSpec("reach", 0, 7)]
    chunk = np.full((len(tasks), CHUNK, ACTION_DIM), 0.3, dtype=np.float32)
    reader = ImageReader(foreign=True)
    with SimProcess("reach", num_slots=len(tasks), env_kwargs={"camera_resolution": 32}) as copied, \
            SimProcess("reach", num_slots=len(tasks), env_kwargs={"camera_resolution": 32}) as shared:
        for proc in (copied, shared):
            proc.send_reset(tasks)
            proc.recv(timeout_s=BOOT_TIMEOUT_S)
            proc.send_step(chunk, np.array([False, True]))
        expected = copied.recv_batch(timeout_s=10.0)
        left = shared.recv_batch(timeout_s=10.0, copy_images=False)
        assert left.shared and len(left.images[CAMERA]) == 0  # only where the images are crossed the pipe
        got = reader.take(left)
        assert not got.shared and got.index.tolist() == expected.index.tolist() == [1]
        np.testing.assert_array_equal(got.images[CAMERA], expected.images[CAMERA])
    reader.close()


def test_child_exception_is_reraised_with_traceback() -> None:
    with SimProcess("reach") as proc:
        proc.send_reset([TaskSpec("reach", 99, 0)])
        with pytest.raises(SimulatorError, match=r"(?s)Traceback.*task_id must be in") as info:
            proc.recv(timeout_s=BOOT_TIMEOUT_S)
        assert str(proc.pid) in str(info.value) and "reset" in str(info.value)
        proc.send_reset([TaskSpec("reach", 0, 0)])  # an env error leaves the process usable
        assert len(proc.recv(timeout_s=10.0)) == 1
    with SimProcess("no_such_env") as bad:
        bad.send_reset([TaskSpec("reach", 0, 0)])
        with pytest.raises(SimulatorError, match="is not a known simulator; choose one of"):
            bad.recv(timeout_s=BOOT_TIMEOUT_S)


def test_expired_deadline_raises_and_close_kills() -> None:
    proc = SimProcess("reach")
    proc.send_reset([TaskSpec("reach", 1, 0)])
    proc.recv(timeout_s=BOOT_TIMEOUT_S)
    os.kill(proc.pid, signal.SIGSTOP)  # a hung simulator: alive but never answers
    proc.send_step(np.zeros((1, CHUNK, ACTION_DIM)), np.array([True]))
    start = time.monotonic()
    with pytest.raises(SimulatorError, match=rf"pid={proc.pid} env='reach' call='step': no answer within"):
        proc.recv(timeout_s=0.3)
    assert time.monotonic() - start < 2.0
    assert proc.broken and proc.is_alive()
    with pytest.raises(SimulatorError, match="broken"):
        proc.send_reset([TaskSpec("reach", 1, 0)])
    pid = proc.pid
    proc.close()
    assert not proc.is_alive()
    assert_gone(pid)


def test_killed_child_raises_on_recv() -> None:
    with SimProcess("reach") as proc:
        proc.send_reset([TaskSpec("reach", 2, 0)])
        proc.recv(timeout_s=BOOT_TIMEOUT_S)
        os.kill(proc.pid, signal.SIGSTOP)  # hold it so the request is surely pending when it dies
        proc.send_step(np.zeros((1, CHUNK, ACTION_DIM)), np.array([True]))
        os.kill(proc.pid, signal.SIGKILL)
        with pytest.raises(SimulatorError, match=r"call='step': child died \(exitcode=-9\)"):
            proc.recv(timeout_s=10.0)
        assert not proc.is_alive()
        pid = proc.pid
    assert_gone(pid)


def test_argument_checks() -> None:
    with SimProcess("reach", num_slots=2) as proc:
        with pytest.raises(ValueError, match="one task per slot"):
            proc.send_reset([TaskSpec("reach", 0, 0)])
        with pytest.raises(ValueError, match="chunks"):
            proc.send_step(np.zeros((1, CHUNK, ACTION_DIM)), np.array([True, True]))
        with pytest.raises(RuntimeError, match="without a pending request"):
            proc.recv(timeout_s=0.1)


LAUNCHER = '''
import os, sys
with open(sys.argv[1], "a") as marks:  # top-level code: a child that re-imports this script writes here too
    marks.write(f"{os.getpid()}\\n")

if __name__ == "__main__":
    from vla_scale.parallel.sim.process import SimProcess
    from vla_scale.envs.types import TaskSpec

    with SimProcess("reach", num_slots=1, env_kwargs={"camera_resolution": 16}) as proc:
        proc.send_reset([TaskSpec("reach", 0, 0)])
        proc.recv(timeout_s=60.0)
        print(proc.pid)
'''


def test_the_child_does_not_run_the_parents_main_module(tmp_path) -> None:
    """A spawned multiprocessing child re-imports the parent's script (and whatever it imports at the top, torch
    in a typical training script); the simulator child must not."""
    script, marks = tmp_path / "launcher.py", tmp_path / "marks.txt"
    script.write_text(LAUNCHER)
    src = str(Path(__file__).resolve().parents[3] / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, str(script), str(marks)], env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    child = int(run.stdout.split()[-1])
    written = marks.read_text().split()
    assert len(written) == 1 and written[0] != str(child)  # the launcher's own pid, once


def rasterizer_threads(pid: int) -> int:
    """Threads of process `pid` that Mesa's llvmpipe started to rasterize frames."""
    names = [(Path(f"/proc/{pid}/task") / tid / "comm").read_text() for tid in os.listdir(f"/proc/{pid}/task")]
    return sum(name.startswith("llvmpipe") for name in names)


def threads_after_a_render() -> int:
    with SimProcess("reach", num_slots=2, env_kwargs={"camera_resolution": 16}) as proc:
        proc.send_reset([TaskSpec("reach", 0, 0), TaskSpec("reach", 1, 1)])
        proc.recv(timeout_s=BOOT_TIMEOUT_S)
        return rasterizer_threads(proc.pid)


def test_simulators_render_without_rasterizer_threads_unless_asked(monkeypatch) -> None:
    """llvmpipe (CPU EGL) would start a rasterizer thread per CPU in every simulator process; a child renders in its
    own thread unless LP_NUM_THREADS says otherwise."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("llvmpipe starts no rasterizer threads on one CPU: nothing to tell apart")
    monkeypatch.setenv("LP_NUM_THREADS", "2")
    asked = threads_after_a_render()
    if asked == 0:
        pytest.skip("the renderer here is not Mesa's llvmpipe")
    assert asked == 2  # the caller's setting is kept
    monkeypatch.delenv("LP_NUM_THREADS")
    assert threads_after_a_render() == 0


def test_simulators_keep_more_freed_chunks_at_hand_and_the_callers_tunables(monkeypatch) -> None:
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    with SimProcess("reach", env_kwargs={"camera_resolution": 16}) as proc:
        # read once the child has answered: the kernel fills /proc/PID/environ late in exec, after the parent
        # already saw the exec succeed, so a read straight after the start can find it empty
        proc.send_reset([TaskSpec("reach", 0, 0)])
        proc.recv(timeout_s=BOOT_TIMEOUT_S)
        environ = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
    assert b"GLIBC_TUNABLES=glibc.malloc.tcache_count=256" in environ  # what the child started with
    # glibc cuts the string it parsed after the first value (in the child's initial environment, which /proc shows)
    # so a caller's tunables are checked where they are put together
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1048576")
    assert _child_environment()["GLIBC_TUNABLES"] == "glibc.malloc.trim_threshold=1048576:glibc.malloc.tcache_count=256"
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.tcache_count=7")
    assert _child_environment()["GLIBC_TUNABLES"] == "glibc.malloc.tcache_count=7"  # the caller's own choice stands
