"""The task sampler draws TRAIN init states and evaluates on the held-out ones (or, on request, the same ones)."""

import numpy as np

from vla_scale.config import EnvConfig
from vla_scale.rollout.sampler import TaskSampler


def test_train_and_eval_init_states_are_disjoint_by_default():
    env = EnvConfig(num_tasks=3, num_train_init_states=5, num_eval_init_states=2)
    sampler = TaskSampler(env, seed=0)
    drawn = {spec.init_state_id for spec in sampler.draw(200)}
    assert drawn == set(range(5))
    assert {spec.init_state_id for spec in sampler.eval_specs()} == {5, 6}
    assert len(sampler.eval_specs()) == 6


def test_train_on_eval_states_reproduces_the_simplevla_rl_setting():
    env = EnvConfig(num_tasks=2, num_train_init_states=5, num_eval_init_states=2, train_on_eval_states=True)
    sampler = TaskSampler(env, seed=0)
    assert {spec.init_state_id for spec in sampler.draw(100)} == {5, 6}


def test_same_seed_same_draws_and_state_round_trip():
    env = EnvConfig()
    a, b = TaskSampler(env, seed=3), TaskSampler(env, seed=3)
    assert a.draw(10) == b.draw(10)
    state = a.state_dict()
    first = a.draw(5)
    b.load_state_dict(state)
    assert b.draw(5) == first


def test_a_draw_of_num_tasks_holds_every_task_in_order_and_larger_draws_stay_balanced():
    env = EnvConfig(num_tasks=10)
    sampler = TaskSampler(env, seed=0)
    for _ in range(5):  # in order: group g stays on task g from step to step
        assert [spec.task_id for spec in sampler.draw(10)] == list(range(10))
    counts = np.bincount([spec.task_id for spec in sampler.draw(25)], minlength=10)
    assert counts.min() >= 2 and counts.max() <= 3 and counts.sum() == 25


def test_small_draws_cover_every_task_over_consecutive_steps_and_resume_mid_round():
    env = EnvConfig(num_tasks=10)
    a = TaskSampler(env, seed=1)
    drawn = [spec.task_id for _ in range(3) for spec in a.draw(4)][:10]
    assert sorted(drawn) == list(range(10))
    state = a.state_dict()
    assert state["round"] == list(range(2, 10))  # 12 drawn: two tasks of the second round out
    b = TaskSampler(env, seed=99)
    b.load_state_dict(state)
    assert b.draw(8) == a.draw(8)
