"""The env loop on the real fleet with real MuJoCo simulators and the real rollout engine.

Every test runs for both placements of the sim workers: inside this process ("trainer") and as Ray actors ("actor").
"""

import os

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
from vla_scale.parallel.sim.fleet import LocalWorkers, SimFleet
from vla_scale.rollout.engine import RolloutEngine
from vla_scale.rollout.env_loop import EnvLoop
from vla_scale.run_policy import fresh_vla

CFG = ModelConfig(image_size=32, patch_size=16, vision_dim=32, hidden_size=32, num_layers=1, num_heads=2,
                  intermediate_size=64, chunk_len=4)


@pytest.fixture(scope="module")
def ray_session():
    start_ray(num_cpus=2)
    yield
    ray.shutdown()


@pytest.fixture(scope="module", params=["trainer", "actor"])
def setup(ray_session, request):
    fleet = SimFleet("reach", {"camera_resolution": 32, "max_steps": 12}, size=4, num_workers=2,
                     sims_per_worker=2, timeout_s=60, in_process=request.param == "trainer")
    vla = fresh_vla(CFG, instructions())
    torch.manual_seed(0)
    engine = RolloutEngine(vla.policy, seed=0, decoder=OFTDecoder())
    engine.version = 5
    yield fleet, engine, vla
    fleet.close()


def test_fleet_places_simulators_on_distinct_processes(setup):
    fleet, _, _ = setup
    pids = fleet.pids()
    assert len(pids) == 4 and len(set(pids)) == 4
    parents = {psutil.Process(pid).ppid() for pid in pids}  # the processes of the sim workers
    if isinstance(fleet.workers, LocalWorkers):
        assert parents == {os.getpid()}
    else:
        assert len(parents) == 2 and os.getpid() not in parents


def test_fleet_answers_in_episode_order(setup):
    fleet, _, _ = setup
    tasks = [TaskSpec("reach", t % 3, t) for t in range(4)]
    fleet.send_reset(tasks, np.ones(4, dtype=bool))
    observations = fleet.recv()
    assert [o.instruction for o in observations] == [instructions()[t.task_id] for t in tasks]
    active = np.array([True, False, True, False])
    fleet.send_step(np.zeros((4, 4, 7), dtype=np.float32), active)
    results = fleet.recv()
    assert [r is None for r in results] == [False, True, False, True]


def test_episodes_come_back_in_order_with_uids_and_versions(setup):
    fleet, engine, processor = setup
    tasks = [TaskSpec("reach", i % 3, i) for i in range(6)]  # more episodes than simulators: two rounds
    uids = [f"g{i // 2}" for i in range(6)]
    trajs = EnvLoop(fleet, engine, processor, max_chunks=3).run(tasks, uids, temperature=1.0)
    assert [t.task for t in trajs] == tasks and [t.uid for t in trajs] == uids
    for t in trajs:
        assert 1 <= len(t) <= 3 and set(t.versions) == {5}
        assert t.success or t.env_steps == 12
        assert t.tokens[0].shape == (CFG.chunk_len * CFG.action_dim,) and t.images[0].shape == (1, 32, 32, 3)


def test_greedy_rollouts_repeat_exactly(setup):
    fleet, engine, processor = setup
    tasks = [TaskSpec("reach", i % 3, 40 + i) for i in range(4)]
    loop = EnvLoop(fleet, engine, processor, max_chunks=3)
    a = loop.run(tasks, ["e"] * 4, 1.0, greedy=True)
    b = loop.run(tasks, ["e"] * 4, 1.0, greedy=True)
    for x, y in zip(a, b, strict=True):
        assert x.success == y.success and x.env_steps == y.env_steps
        np.testing.assert_array_equal(np.stack(x.tokens), np.stack(y.tokens))


def test_each_chunk_records_how_many_of_its_actions_ran(ray_session):
    """A step limit inside a chunk (10 steps, chunks of 4): the last chunk ran 2 actions, and only their tokens will
    enter the loss (`executed_action_mask`)."""
    from vla_scale.objectives import executed_action_mask

    fleet = SimFleet("reach", {"camera_resolution": 32, "max_steps": 10}, size=2, num_workers=1, sims_per_worker=2,
                     timeout_s=60, in_process=True)
    try:
        vla = fresh_vla(CFG, instructions())
        torch.manual_seed(0)
        trajs = EnvLoop(fleet, RolloutEngine(vla.policy, seed=1, decoder=OFTDecoder()), vla, max_chunks=3).run(
            [TaskSpec("reach", 0, 1), TaskSpec("reach", 1, 2)], ["a", "b"], temperature=1.0)
    finally:
        fleet.close()
    for t in trajs:
        assert len(t.executed) == len(t) and sum(t.executed) == t.env_steps
        assert all(n == CFG.chunk_len for n in t.executed[:-1])
        if not t.success:
            assert t.executed == [4, 4, 2]
            mask = executed_action_mask(torch.tensor(t.executed), CFG.chunk_len, CFG.action_dim)
            assert mask.sum(dim=1).tolist() == [28, 28, 14]


def test_success_metrics_give_the_rate_and_each_tasks_rate_under_the_logged_names():
    from vla_scale.rollout.env_loop import success_metrics

    outcomes = [(TaskSpec("reach", 0, 1), True), (TaskSpec("reach", 0, 2), False), (TaskSpec("reach", 1, 1), True)]
    assert success_metrics(outcomes, 2) == {"eval/success_rate": 2 / 3, "eval/task_0_success_rate": 0.5,
                                            "eval/task_1_success_rate": 1.0}
    # task groups: each the mean of its tasks' rates, the macro average the mean of the groups' (not of episodes)
    outcomes += [(TaskSpec("reach", 2, 1), False)]
    grouped = success_metrics(outcomes, 3, {"easy": [0, 1], "hard": [2]})
    assert grouped["eval/group_easy_success_rate"] == 0.75 and grouped["eval/group_hard_success_rate"] == 0.0
    assert grouped["eval/group_macro_success_rate"] == 0.375 and grouped["eval/success_rate"] == 0.5
