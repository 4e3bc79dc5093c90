"""Pipelined env loop and fault handling on the real fleet with real MuJoCo simulator processes.

Fleet tests run for both placements of the sim workers: inside this process ("trainer", the direct path) and as
Ray actors ("actor").
"""

import os
import random
import signal
import threading
import time

import numpy as np
import psutil
import pytest
import ray
import torch

from vla_scale.config import ModelConfig
from vla_scale.envs.reach import instructions
from vla_scale.envs.types import TaskSpec
from vla_scale.models.oft.decode import OFTDecoder
from vla_scale.parallel.sim.cluster import start_ray
from vla_scale.parallel.sim.fleet import SimFleet, SimWorker
from vla_scale.parallel.sim.process import SimulatorError
from vla_scale.rollout.engine import RolloutEngine
from vla_scale.rollout.env_loop import EnvLoop
from vla_scale.run_policy import fresh_vla

CFG = ModelConfig(image_size=32, patch_size=16, vision_dim=32, hidden_size=32, num_layers=1, num_heads=2,
                  intermediate_size=64, chunk_len=4)


@pytest.fixture(scope="module")
def parts():
    start_ray(num_cpus=2)
    vla = fresh_vla(CFG, instructions())
    torch.manual_seed(0)
    yield RolloutEngine(vla.policy, seed=0, decoder=OFTDecoder()), vla
    ray.shutdown()


@pytest.fixture(params=["trainer", "actor"])
def in_process(request) -> bool:
    """Sim workers inside this process (the direct path), or Ray actors."""
    return request.param == "trainer"


def make_fleet(stages: int, max_steps: int = 12, timeout_s: float = 60.0, max_failures: int = 3,
               in_process: bool = True, max_delta: float | None = None) -> SimFleet:
    """Simulator processes get 20 s to start (a process stopped while starting is detected after that).
    `max_delta`: the reach env's step size (a tiny one keeps every episode running to `max_steps`)."""
    env = {"camera_resolution": 32, "max_steps": max_steps} | ({} if max_delta is None else {"max_delta": max_delta})
    return SimFleet("reach", env, size=8,
                    num_workers=2 if stages < 4 else 1, sims_per_worker=2, timeout_s=timeout_s, stages=stages,
                    max_failures=max_failures, boot_timeout_s=20.0, in_process=in_process)


def tasks_and_uids(n: int, first_state: int = 0):
    tasks = [TaskSpec("reach", i % 3, first_state + i) for i in range(n)]
    return tasks, [f"u{i}" for i in range(n)]


def test_stages_interleave_over_every_process(parts):
    fleet = make_fleet(stages=2)
    try:
        stage = fleet.slot_stages()
        assert stage.tolist() == [0, 1] * 4  # 2 slots per process: one per stage, every process in every stage
    finally:
        fleet.close()


@pytest.mark.parametrize("stages", [1, 2, 4])
def test_episode_order_and_uids_survive_stages(parts, stages, in_process):
    engine, processor = parts
    fleet = make_fleet(stages, in_process=in_process)
    try:
        loop = EnvLoop(fleet, engine, processor, max_chunks=3)
        tasks, uids = tasks_and_uids(12)  # 1.5 rounds of 8 slots
        trajs = loop.run(tasks, uids, temperature=1.0, greedy=True)
        assert [t.task for t in trajs] == tasks and [t.uid for t in trajs] == uids
        assert all(1 <= len(t) <= 3 and (t.success or t.env_steps == 12) for t in trajs)
        assert loop.stats.env_steps == sum(t.env_steps for t in trajs)
    finally:
        fleet.close()


def test_prefetched_resets_are_used_and_wrong_ones_are_dropped(parts, in_process):
    engine, processor = parts
    fleet = make_fleet(stages=2, in_process=in_process)
    try:
        loop = EnvLoop(fleet, engine, processor, max_chunks=2)
        tasks, uids = tasks_and_uids(8)
        loop.prefetch(tasks)
        first = loop.run(tasks, uids, 1.0, greedy=True)
        loop.prefetch(tasks_and_uids(8, first_state=20)[0])
        again = loop.run(tasks, uids, 1.0, greedy=True)  # prefetch for other tasks: drained, then reset afresh
        assert [t.env_steps for t in first] == [t.env_steps for t in again]
    finally:
        fleet.close()


def test_local_workers_leave_images_in_shared_memory_and_answers_match(parts, in_process):
    tasks, _ = tasks_and_uids(8)
    answers = []
    for copy in (False, True):
        fleet = make_fleet(stages=2, in_process=in_process)
        try:
            assert fleet.workers.local == [True, True]  # one node: the driver reads the simulators' images itself
            if copy:
                fleet.workers.local = [False, False]  # as a worker on another node answers: images through Ray
            fleet.send_reset(tasks, np.ones(8, dtype=bool))
            fleet.recv()
            fleet.send_step(np.full((8, 4, 7), 0.4, dtype=np.float32), fleet.slot_stages() == 1)
            answers.append(fleet.recv())
        finally:
            fleet.close()
    for shared, copied in zip(*answers, strict=True):
        assert (shared is None) == (copied is None)
        if shared is not None:
            np.testing.assert_array_equal(shared.observation.images["agentview"],
                                          copied.observation.images["agentview"])
            assert shared.steps_taken == copied.steps_taken


def test_killed_process_restarts_its_episodes_from_their_initial_state(parts, in_process):
    fleet = make_fleet(stages=2, in_process=in_process)
    try:
        tasks, _ = tasks_and_uids(8)
        fleet.send_reset(tasks, np.ones(8, dtype=bool))
        initial = fleet.recv()
        os.kill(fleet.pids()[0], signal.SIGKILL)  # process 0 of worker 0 holds slots 0 and 1
        fleet.send_step(np.full((8, 4, 7), 0.5, dtype=np.float32), np.ones(8, dtype=bool))
        results = fleet.recv()
        assert [type(r).__name__ for r in results[:2]] == ["Restarted", "Restarted"]
        np.testing.assert_array_equal(results[0].observation.images["agentview"], initial[0].images["agentview"])
        assert all(type(r).__name__ == "ChunkStep" for r in results[2:])
        assert fleet.stats.restarts == 1
    finally:
        fleet.close()


def kill_at_random(pids: list[int], sig: int, delay_range: tuple[float, float], seed: int) -> threading.Thread:
    rng = random.Random(seed)

    def run():
        time.sleep(rng.uniform(*delay_range))
        os.kill(rng.choice(pids), sig)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("sig,timeout_s", [(signal.SIGKILL, 60.0), (signal.SIGSTOP, 1.0)], ids=["killed", "hung"])
def test_rollout_completes_with_every_episode_once_despite_a_fault(parts, sig, timeout_s, in_process):
    engine, processor = parts
    # steps too small to reach the target: every episode is still running when the fault lands, so it restarts one
    fleet = make_fleet(stages=2, max_steps=120, timeout_s=timeout_s, in_process=in_process, max_delta=1e-5)
    try:
        loop = EnvLoop(fleet, engine, processor, max_chunks=30)
        tasks, uids = tasks_and_uids(8)
        fleet.send_reset(tasks, np.ones(8, dtype=bool))  # let every process finish starting first
        fleet.recv()
        killer = kill_at_random(fleet.pids(), sig, (0.05, 0.3), seed=1)
        trajs = loop.run(tasks, uids, temperature=1.0)
        killer.join()
        assert [t.uid for t in trajs] == uids and [t.task for t in trajs] == tasks
        assert loop.stats.restarts >= 1 and sum(t.restarts for t in trajs) >= 1
        for t in trajs:
            assert not t.success and t.env_steps == 120
            assert len(t) == len(t.tokens) == len(t.images) and len(t) <= 30
    finally:
        fleet.close()


def test_repeated_failures_stop_with_worker_and_task_named(parts, in_process):
    engine, processor = parts
    fleet = make_fleet(stages=1, max_failures=1, in_process=in_process)
    try:
        tasks, _ = tasks_and_uids(8)
        fleet.send_reset(tasks, np.ones(8, dtype=bool))
        fleet.recv()
        os.kill(fleet.pids()[3], signal.SIGKILL)  # worker 1, process 1
        fleet.send_step(np.zeros((8, 4, 7), dtype=np.float32), np.ones(8, dtype=bool))
        with pytest.raises(SimulatorError, match=r"sim worker 1 process 1 .*TaskSpec"):
            fleet.recv()
    finally:
        fleet.close()



def test_workers_in_this_process_are_no_ray_actors_and_play_as_the_actors_do(parts):
    """Same seed, same episodes: the direct path and the Ray actors give the same trajectories, bit for bit."""
    engine, processor = parts
    tasks, uids = tasks_and_uids(8, first_state=30)
    start = engine.generator.get_state()
    played = {}
    for in_process in (True, False):
        fleet = make_fleet(stages=2, max_steps=24, in_process=in_process)
        try:
            if in_process:  # plain objects; their simulator processes are children of this process
                assert all(type(w) is SimWorker for w in fleet.workers.workers)
                assert {psutil.Process(pid).ppid() for pid in fleet.pids()} == {os.getpid()}
            else:
                assert all(isinstance(w, ray.actor.ActorHandle) for w in fleet.workers.workers)
                assert os.getpid() not in {psutil.Process(pid).ppid() for pid in fleet.pids()}  # the actors' children
            engine.generator.set_state(start)
            played[in_process] = EnvLoop(fleet, engine, processor, max_chunks=6).run(tasks, uids, temperature=1.0)
            # the simulator processes' resident sets, read where they run, as psutil reads them here (after they
            # played: a process just started may not have loaded its interpreter yet)
            for pid, size in zip(fleet.pids(), fleet.rss(), strict=True):
                assert size > 2**20 and abs(size - psutil.Process(pid).memory_info().rss) < 2**24, (pid, size)
        finally:
            fleet.close()
    for here, actor in zip(played[True], played[False], strict=True):
        assert (here.uid, here.success, here.env_steps, len(here)) == (actor.uid, actor.success, actor.env_steps,
                                                                        len(actor))
        for name in ("images", "proprio", "tokens", "logprobs"):
            np.testing.assert_array_equal(np.stack(getattr(here, name)), np.stack(getattr(actor, name)))
