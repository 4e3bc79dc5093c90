"""PretrainedVLA without a checkpoint fixture: the simulators' image preparation equals the trainer's, the prompt
budget, the action conventions per env."""

import numpy as np
import pytest

from vla_scale.config import ConfigError, EnvConfig, ModelConfig
from vla_scale.envs.reach import instructions
from vla_scale.envs.registry import make_env
from vla_scale.envs.types import TaskSpec
from vla_scale.models.oft import PretrainedVLA
from vla_scale.run_policy import fresh_vla, vla_for_env

CFG = ModelConfig(image_size=32, patch_size=16, vision_dim=32, hidden_size=32, num_layers=1, num_heads=2,
                  intermediate_size=64, chunk_len=4)


def vla_for(**changes) -> PretrainedVLA:
    return fresh_vla(ModelConfig(**{**vars(CFG), **changes}), instructions())


def test_simulators_make_exactly_the_images_the_trainer_would():
    vla = vla_for(image_resize="jpeg_lanczos3", center_crop=True)
    env_cfg = EnvConfig(camera_resolution=48, max_steps=8)
    kwargs = vla.simulator_kwargs(env_cfg)
    assert kwargs["camera_resolution"] == 48
    assert kwargs["image_prep"] == {"size": 32, "center_crop": True, "crop_area": 0.9, "cameras": ("agentview",)}
    prepared, raw = make_env("reach", **kwargs), make_env("reach", **{k: v for k, v in kwargs.items()
                                                                       if k != "image_prep"})
    task = TaskSpec("reach", 1, 3)
    for mine, theirs in [(prepared.reset(task), raw.reset(task))] + [
            (prepared.step(chunk).observation, raw.step(chunk).observation)
            for chunk in np.random.default_rng(0).uniform(-1, 1, (2, 4, 7))]:
        assert mine.images["agentview"].shape == (32, 32, 3)
        images, _ = vla.processor.prepare([theirs])
        np.testing.assert_array_equal(vla.processor.prepare([mine], prepared=True)[0], images)


def test_torch_only_preparation_stays_in_the_trainer():
    assert "image_prep" not in vla_for().simulator_kwargs(EnvConfig(camera_resolution=48))  # bicubic resize: torch
    assert "image_prep" in vla_for().simulator_kwargs(EnvConfig(camera_resolution=32))  # nothing to resize
    assert vla_for().simulator_kwargs(EnvConfig(camera_resolution=0))["camera_resolution"] == 32  # the policy's


def test_the_prompt_budget_is_sized_to_the_suite_or_checked_against_it():
    longest = max(len(vla_for().prompt_ids(t)) for t in instructions())
    assert vla_for().max_text_len == longest
    assert vla_for(max_text_len=longest + 3).max_text_len == longest + 3
    with pytest.raises(ValueError, match=f"has {longest} tokens > model.max_text_len={longest - 1}"):
        vla_for(max_text_len=longest - 1)
    with pytest.raises(ConfigError, match="model.max_text_len"):
        vla_for_env(ModelConfig(**{**vars(CFG), "max_text_len": 5}), EnvConfig())


def test_actions_reach_each_env_in_its_convention():
    actions = np.array([[[0.1, -0.2, 0.3, 0.0, 0.0, 0.0, 0.7], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.2]]])
    np.testing.assert_array_equal(vla_for().env_actions(actions), actions)  # a policy of our own: unchanged
    from vla_scale.envs.registry import simulator

    libero = simulator("libero").action_postprocess("openvla")(actions)
    assert libero[0, :, -1].tolist() == [-1.0, 1.0]  # OpenVLA gripper 0.7 (open) -> LIBERO -1, 0.2 -> +1 (close)
    np.testing.assert_array_equal(libero[..., :-1], actions[..., :-1])
    with pytest.raises(ValueError, match="cannot take OpenVLA-convention actions"):
        simulator("reach").action_postprocess("openvla")


def test_a_policy_that_does_not_fit_the_env_is_refused_naming_the_keys():
    with pytest.raises(ConfigError) as err:
        vla_for_env(ModelConfig(**{**vars(CFG), "num_images": 2, "action_dim": 6}), EnvConfig())
    assert "takes 2 images" in str(err.value) and "6-d actions" in str(err.value)


def test_checking_a_checkpoint_folder_parses_each_json_file_once(tmp_path, monkeypatch):
    """The checks and the spec share the parsed files: a run start reads config.json and preprocessor_config.json
    once each before any weight is built."""
    import builtins
    import collections
    import os

    vla_for().save_pretrained(str(tmp_path))
    opened: collections.Counter = collections.Counter()
    real_open = builtins.open

    def counting_open(file, *args, **kwargs):
        if isinstance(file, str) and file.startswith(str(tmp_path)):
            opened[os.path.basename(file)] += 1
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    vla = vla_for_env(ModelConfig(checkpoint=str(tmp_path)), EnvConfig())
    assert vla.spec.chunk_len == CFG.chunk_len
    assert opened["config.json"] == 1 and opened["preprocessor_config.json"] == 1, dict(opened)


def test_the_policy_line_names_the_tokenizer_alike_before_and_after_saving(tmp_path):
    """A fresh policy holds a `WordTokenizer`, its saved folder reads back as an `HFTokenizer`: SFT's, eval's and
    train's `policy:` lines name the same tokenizer by what it is, not by the class holding it."""
    import re

    fresh = vla_for()
    fresh.save_pretrained(str(tmp_path))
    loaded = vla_for_env(ModelConfig(checkpoint=str(tmp_path)), EnvConfig())
    assert type(fresh.tokenizer) is not type(loaded.tokenizer)
    name = fresh.tokenizer.name
    assert re.fullmatch(rf"word-level tokenizer of {fresh.tokenizer.vocab_size} tokens", name), name
    assert loaded.tokenizer.name == name
    for vla in (fresh, loaded):
        assert f"tokens ({name}); " in vla.describe(EnvConfig()), vla.describe(EnvConfig())
