"""Each simulator's record is the one place its facts live: the config, the checks, the docs and the policy read
them from the registry."""

from __future__ import annotations

import dataclasses

import pytest

from vla_scale.config import BOUNDS, EnvConfig
from vla_scale.config.docs import config_markdown
from vla_scale.envs.registry import SIMULATORS, simulator


@pytest.mark.parametrize("name", sorted(SIMULATORS))
def test_a_record_is_what_the_rest_of_the_code_reads(name: str) -> None:
    sim = simulator(name)
    assert sim.name == name
    env_fields = {f.name: f for f in dataclasses.fields(EnvConfig)}
    assert isinstance(env_fields[name].default_factory(), sim.settings)  # env.<name>.* is the record's settings
    numeric = {f.name for f in dataclasses.fields(sim.settings) if f.type in ("int", "float", int, float)}
    assert set(sim.settings.BOUNDS) == numeric  # every numeric setting has its range...
    assert {f"env.{name}.{k}" for k in numeric} <= set(BOUNDS)  # ...and validate() checks it
    assert f"## `env.{name}` ({sim.settings.__name__})" in config_markdown()
    assert (sim.env_class.ACTION_DIM, sim.env_class.PROPRIO_DIM, sim.env_class.NUM_INIT_STATES) == (
        sim.action_dim, sim.proprio_dim, sim.num_init_states)
    assert sim.cameras and sim.suites


def test_an_unknown_simulator_is_named_with_the_choices() -> None:
    with pytest.raises(ValueError, match=r"env.name='mujoco_menagerie' is not a known simulator; choose one of"):
        simulator("mujoco_menagerie")


def test_action_conventions() -> None:
    assert simulator("libero").action_postprocess("openvla") is simulator("libero").openvla_actions
    with pytest.raises(ValueError, match="cannot take OpenVLA-convention actions"):
        simulator("reach").action_postprocess("openvla")
    with pytest.raises(ValueError, match="unknown action convention"):
        simulator("reach").action_postprocess("ros")
