"""Every shipped model preset fits the instructions of every shipped env it can play: a preset that the launch
scripts' check (`run_policy.vla_for_env`) refuses on an env only for its prompt budget fails here, and so does a π0.5
preset whose prompt (the instruction and the state's bins, known only as an episode runs) can outgrow its budget.
No weights are built: the check reads the spec, the tokenizer and the env's instructions."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from vla_scale.config import Config, ConfigError, register_configs, to_config
from vla_scale.envs.libero_install import LiberoNotInstalled
from vla_scale.envs.registry import simulator
from vla_scale.models.pi0.tokenizer import STATE_BINS
from vla_scale.run_policy import vla_for_env

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
TOKENIZER = ROOT / "tests" / "fixtures" / "openpi_reference" / "tokenizer.model"
"""The SentencePiece model the tiny π0 presets name (their YAML's comment): a fresh π0 needs one."""
MODELS = sorted(p.stem for p in (CONFIGS / "model").glob("*.yaml"))
ENVS = sorted(p.stem for p in (CONFIGS / "env").glob("*.yaml"))


def shipped(model: str, env: str) -> Config:
    """The shipped configuration of `model=<model> env=<env>`, a fresh π0 given the fixture's tokenizer."""
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = to_config(compose(config_name="config", overrides=[f"model={model}", f"env={env}"]))
    if cfg.model.family == "pi0":
        cfg.model.pi0.tokenizer = str(TOKENIZER)
    return cfg


def unbounded(cfg: Config) -> Config:
    """`cfg` with its family's prompt budget lifted (OFT: sized to the suite's longest prompt)."""
    cfg = copy.deepcopy(cfg)
    cfg.model.max_text_len, cfg.model.pi0.max_token_len = 0, 4096
    return cfg


def refusal(cfg: Config) -> str:
    """'' when the launch scripts' check takes the policy on the env, else its ConfigError's message."""
    try:
        vla_for_env(cfg.model, cfg.env)
    except ConfigError as err:
        return str(err)
    return ""


def longest_state_prompt(tokenizer, instructions: list[str], state_size: int) -> int:
    """π0.5's longest prompt over `instructions` with every state dimension in the bin written with most tokens."""
    edges = np.linspace(-1, 1, STATE_BINS + 1)
    values = [-2.0, *((edges[:-1] + edges[1:]) / 2)]  # one value per bin, -1 (below the range) to 255
    widest = max(values, key=lambda v: len(tokenizer.prompt_ids("", np.full(1, v))))
    return max(len(tokenizer.prompt_ids(text, np.full(state_size, widest))) for text in instructions)


@pytest.mark.parametrize("env", ENVS)
@pytest.mark.parametrize("model", MODELS)
def test_a_shipped_preset_fits_the_prompts_of_each_shipped_env_it_can_play(model: str, env: str) -> None:
    cfg = shipped(model, env)
    face = simulator(cfg.env.name)
    try:
        instructions = face.instructions(cfg.env.suite)[: cfg.env.num_tasks]
    except LiberoNotInstalled:
        pytest.skip("LIBERO's task map comes with the libero package (`make libero`)")
    if refusal(unbounded(cfg)):
        return  # it cannot play this env whatever its budget (action or state sizes, cameras)
    problem = refusal(cfg)
    assert not problem, f"model={model} is refused on env={env}: {problem}"
    source = vla_for_env(cfg.model, cfg.env)
    if cfg.model.family == "pi0" and source.spec.state_in_prompt:
        longest = longest_state_prompt(source.tokenizer, instructions, face.state_size(cfg.env.simulator_kwargs()))
        assert longest <= source.spec.max_token_len, (
            f"model={model} on env={env}: prompts of up to {longest} tokens with the state > the budget "
            f"{source.spec.max_token_len} (model.pi0.max_token_len)")


def test_a_budget_too_small_for_an_env_fails_the_check() -> None:
    """What the test above rests on: the launch scripts' check refuses a π0 budget the instructions outgrow, and a
    π0.5 prompt with the state is longer than its instruction alone."""
    cfg = shipped("pi0_tiny", "reach")
    cfg.model.pi0.max_token_len = 12
    assert "set model.pi0.max_token_len=13" in refusal(cfg)
    source = vla_for_env(shipped("pi05_tiny", "reach").model, cfg.env)
    texts = simulator("reach").instructions("reach")
    alone = max(len(source.tokenizer.prompt_ids(t)) for t in texts)
    assert longest_state_prompt(source.tokenizer, texts, 4) > alone + 4
