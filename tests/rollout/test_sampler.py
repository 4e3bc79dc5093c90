"""The task sampler draws TRAIN init states and evaluates on the held-out ones (or, on request, the same ones)."""

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
