"""What a Meta-World policy reads beside its image (`env.metaworld.observation`): agent (LeRobot's 4-D state),
agent_goal (with the goal's xyz) and full (Meta-World's 39-D observation); a fresh policy follows the choice, a
checkpoint trained on one is refused on another before any simulator starts, naming the one it needs."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ROOT

pytest.importorskip("metaworld", reason="Meta-World is not installed: `make metaworld`")

from hydra import compose, initialize_config_dir  # noqa: E402

from vla_scale.config import Config, ConfigError, register_configs, to_config, validate  # noqa: E402
from vla_scale.envs.metaworld import GOAL, OBSERVATIONS, MetaWorldEnv  # noqa: E402
from vla_scale.envs.registry import simulator  # noqa: E402
from vla_scale.envs.types import TaskSpec  # noqa: E402

TOKENIZER = ROOT / "tests" / "fixtures" / "openpi_reference" / "tokenizer.model"


def shipped(*overrides: str) -> Config:
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return to_config(compose(config_name="config", overrides=["env=metaworld_mt10", *overrides]))


def test_each_observation_is_its_part_of_metaworlds_39_numbers() -> None:
    """The same placement under each choice: the agent state, the agent state and the goal Meta-World placed (its
    `_target_pos`, which moves with the placement), or all 39 numbers, after a reset and after a step."""
    seen = {}
    for name, size in OBSERVATIONS.items():
        env = MetaWorldEnv(camera_resolution=16, observation=name)
        first = env.reset(TaskSpec("mt10", 0, 1003)).proprio
        goal = np.array(env.raw._target_pos)
        after = env.step(np.array([[0.5, -0.2, 0.1, 1.0]])).observation.proprio
        state = env.state
        env.close()
        assert first.shape == after.shape == (size,) and np.array_equal(after, state[:size] if name != "agent_goal"
                                                                          else np.r_[state[:4], state[GOAL]])
        seen[name] = (first, goal)
    agent, goal = seen["agent_goal"]
    assert np.array_equal(agent[:4], seen["agent"][0]) and np.allclose(agent[4:], goal)
    assert np.array_equal(seen["full"][0][GOAL], agent[4:])
    other = MetaWorldEnv(camera_resolution=16, observation="agent_goal")
    moved = other.reset(TaskSpec("mt10", 0, 1004)).proprio
    other.close()
    assert not np.allclose(moved[4:], agent[4:])  # reach's goal is placed anew with each seed


def test_the_state_size_follows_the_setting_and_a_bad_name_is_refused() -> None:
    sim = simulator("metaworld")
    for name, size in OBSERVATIONS.items():
        cfg = shipped(f"env.metaworld.observation={name}", "model=tiny_metaworld")
        assert sim.state_size(cfg.env.simulator_kwargs()) == size
        assert sim.observation_name(cfg.env.simulator_kwargs()) == name
    assert simulator("reach").state_size({}) == 4 and simulator("reach").observation_name({}) == ""
    with pytest.raises(ConfigError, match="env.metaworld.observation='goal' is not a Meta-World observation; choose "
                                          "one of agent, agent_goal, full"):
        validate(shipped("env.metaworld.observation=goal", "model=tiny_metaworld"))
    with pytest.raises(ValueError, match="observation must be one of"):
        MetaWorldEnv(observation="goal")


def test_a_fresh_oft_policy_reads_the_chosen_state_and_its_checkpoint_plays_only_that(tmp_path) -> None:
    from vla_scale.run_policy import vla_for_env

    cfg = shipped("env.metaworld.observation=agent_goal", "model=tiny_metaworld")
    vla = vla_for_env(cfg.model, cfg.env)
    assert vla.spec.proprio_dim == 7
    vla.save_pretrained(str(tmp_path / "ckpt"))
    for name in ("agent", "full"):
        other = shipped(f"env.metaworld.observation={name}", f"model.checkpoint={tmp_path / 'ckpt'}")
        with pytest.raises(ConfigError) as err:
            vla_for_env(other.model, other.env)
        size = OBSERVATIONS[name]
        assert f"takes 7-d states but env 'metaworld' gives {size}-d states ({name}): set " \
               "env.metaworld.observation=agent_goal to play it" in str(err.value), str(err.value)
    again = shipped("env.metaworld.observation=agent_goal", f"model.checkpoint={tmp_path / 'ckpt'}")
    assert vla_for_env(again.model, again.env).spec.proprio_dim == 7


def test_a_pi0_policy_trained_on_one_observation_is_refused_on_another() -> None:
    """π0 pads the state to its action width, so the size it was trained on is its norm stats' (made from the
    demonstrations); the full 39-D state does not fit the tiny preset's 8 action dims at all."""
    from vla_scale.datasets.episodes import Episode
    from vla_scale.run_policy import vla_for_env

    cfg = shipped("env.metaworld.observation=agent_goal", "model=pi0_tiny", f"model.pi0.tokenizer={TOKENIZER}",
                  "model.pi0.max_token_len=32")
    rng = np.random.default_rng(0)
    demos = [Episode(instruction="Reach a goal position", images={"corner2": np.zeros((5, 8, 8, 3), np.uint8)},
                     state=rng.normal(size=(5, 7)).astype(np.float32),
                     actions=rng.uniform(-1, 1, (5, 4)).astype(np.float32), success=True)]
    trained = vla_for_env(cfg.model, cfg.env).with_demonstrations("metaworld", demos)
    assert trained.trained_state_size() == 7 and not trained.check_env(cfg.env)
    agent = shipped("env.metaworld.observation=agent", "model=pi0_tiny").env
    assert any("was trained on 7-d states but env 'metaworld' gives 4-d states (agent): set "
               "env.metaworld.observation=agent_goal to play it" in p for p in trained.check_env(agent))
    full = shipped("env.metaworld.observation=full", "model=pi0_tiny").env
    assert any("39-d proprio states but the policy's state size is 8: set model.pi0.action_dim >= 39" in p
               for p in trained.check_env(full))
