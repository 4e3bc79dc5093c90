"""A simulator process the fleet replaces is reported as a warning in the trainer's process, naming the worker, the
process and the cause, for real faults on real reach simulators: a killed process (its exit code), a hung one (the
deadline) and an env that raises (the exception, one line), with the worker in this process or as a Ray actor; and
in a training run, on the console and in the run's log file."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import psutil
import pytest
import ray
from conftest import ROOT, TINY, script_env

from vla_scale.envs.types import TaskSpec
from vla_scale.parallel.sim.cluster import start_ray
from vla_scale.parallel.sim.fleet import SimFleet

SIZE = 4  # 1 worker x 2 processes x 2 simulators: process 0 holds slots 0 and 1


def make_fleet(in_process: bool = True, timeout_s: float = 60.0) -> SimFleet:
    return SimFleet("reach", {"camera_resolution": 32, "max_steps": 40}, size=SIZE, num_workers=1, sims_per_worker=2,
                    timeout_s=timeout_s, boot_timeout_s=20.0, in_process=in_process)


def step_after(fleet: SimFleet, fault, chunks: np.ndarray | None = None) -> list:
    """Reset every slot, let `fault(pid of process 0)` happen, then step every slot; the step's results."""
    fleet.send_reset([TaskSpec("reach", i % 3, i) for i in range(SIZE)], np.ones(SIZE, dtype=bool))
    fleet.recv()
    fault(fleet.pids()[0])
    chunk = np.zeros((SIZE, 4, 7), dtype=np.float32) if chunks is None else chunks
    fleet.send_step(chunk, np.ones(SIZE, dtype=bool))
    return fleet.recv()


def replaced_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "vla_scale.parallel.sim.fleet" and r.levelno == logging.WARNING]


@pytest.mark.parametrize("in_process", [True, False], ids=["trainer", "actor"])
def test_a_killed_process_is_reported_with_its_worker_and_exit_code(caplog, in_process: bool) -> None:
    if not in_process:
        start_ray(num_cpus=2)
    fleet = make_fleet(in_process)
    try:
        with caplog.at_level(logging.WARNING):
            results = step_after(fleet, lambda pid: os.kill(pid, signal.SIGKILL))
        now = fleet.pids()  # the replacement first
    finally:
        fleet.close()
        if not in_process:
            ray.shutdown()
    assert [type(r).__name__ for r in results[:2]] == ["Restarted", "Restarted"]
    lines = replaced_lines(caplog)
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"sim worker 0 process 0 (reach) replaced by pid {now[0]}: simulator pid="), lines
    # the kill is noticed on the next send (the pipe is broken: "child is gone") or the next read ("child died")
    assert any(f"{cause} (exitcode=-9)" in lines[0] for cause in ("child died", "child is gone")), lines
    assert "its 2 running episode(s) start again" in lines[0]
    assert "parallel.max_failures=3" in lines[0]


def test_a_hung_process_is_reported_with_the_deadline_it_missed(caplog) -> None:
    fleet = make_fleet(timeout_s=1.0)
    try:
        with caplog.at_level(logging.WARNING):
            step_after(fleet, lambda pid: os.kill(pid, signal.SIGSTOP))
    finally:
        fleet.close()
    lines = replaced_lines(caplog)
    assert len(lines) == 1 and "sim worker 0 process 0" in lines[0], lines
    assert "call='step': no answer within 1.000s (alive=True)" in lines[0], lines


def test_an_env_that_raises_is_reported_by_its_exception_on_one_line(caplog) -> None:
    wrong = np.zeros((SIZE, 4, 2), dtype=np.float32)  # 2-D actions: the reach env's step raises in the child
    fleet = make_fleet()
    try:
        with caplog.at_level(logging.WARNING):
            step_after(fleet, lambda pid: None, wrong)
    finally:
        fleet.close()
    lines = replaced_lines(caplog)
    assert {line.split(" (reach")[0] for line in lines} == {"sim worker 0 process 0", "sim worker 0 process 1"}
    for line in lines:
        assert "\n" not in line and "Traceback" not in line, line
        assert "raised in the child: " in line and "Error" in line.split("raised in the child: ")[1], line


@pytest.mark.slow
def test_a_training_run_says_on_the_console_and_in_its_log_which_simulator_it_replaced_and_why(tmp_path) -> None:
    """A simulator process of launch/train.py killed as training starts: the run finishes, and the replacement's
    line (worker, process, exit code) is on the console and in the run's log file."""
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(ROOT / "launch" / "train.py"), *TINY, "steps=3", "eval_every=0",
                             "save_every=0", f"run_dir={run}"], cwd=ROOT, env=script_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True).start()
    deadline = time.monotonic() + 300
    while not any(line.startswith("training steps") for line in lines) and proc.poll() is None:
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.002)
    sims = [p for p in psutil.Process(proc.pid).children(recursive=True) if "_child_entry" in " ".join(p.cmdline())]
    assert sims, "".join(lines)[-3000:]
    os.kill(sims[0].pid, signal.SIGKILL)
    assert proc.wait(timeout=300) == 0, "".join(lines)[-3000:]
    said = [line for line in lines if "replaced by pid" in line]
    assert len(said) == 1, "".join(lines)[-3000:]
    assert "[vla_scale.parallel.sim.fleet][WARNING] - sim worker 0 process " in said[0], said
    assert f"simulator pid={sims[0].pid} env='reach'" in said[0] and "(exitcode=-9)" in said[0], said
    assert said[0].split(" - ", 1)[1] in (run / "train.log").read_text()
