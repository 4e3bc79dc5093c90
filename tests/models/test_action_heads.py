"""The L1-regression head as a property of the checkpoint: its Gaussian's math against torch.distributions, the
official side-file layout written and read back, what trains in a LoRA run, the engine's samples, log-probs and
actions, and the folder's head decided and refused as a user would meet it."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch

from vla_scale.config import LoraConfig, ModelConfig
from vla_scale.envs.reach import instructions
from vla_scale.models.oft import PretrainedVLA
from vla_scale.models.oft.decode import OFTDecoder
from vla_scale.models.oft.pretrained import CheckpointError, folder_action_head
from vla_scale.objectives import gaussian_entropy, gaussian_logprobs
from vla_scale.run_policy import fresh_vla

SMALL = dict(image_size=32, patch_size=8, vision_dim=32, hidden_size=32, num_layers=1, num_heads=2,
             intermediate_size=64)


def l1_vla(**kw) -> PretrainedVLA:
    torch.manual_seed(0)
    return fresh_vla(ModelConfig(**SMALL, action_head="l1", **kw), instructions())


def observations(vla: PretrainedVLA, n: int = 3) -> list:
    from vla_scale.envs.types import Observation

    rng = np.random.default_rng(0)
    return [Observation({c: rng.integers(0, 256, (32, 32, 3), dtype=np.uint8) for c in vla.cameras},
                        rng.standard_normal(4), instructions()[i % 3]) for i in range(n)]


def test_gaussian_logprobs_and_entropy_are_torch_distributions():
    mean, log_std = torch.randn(4, 56), torch.randn(56) * 0.5
    x = mean + torch.randn(4, 56) * 2
    normal = torch.distributions.Normal(mean, log_std.exp().expand_as(mean))
    torch.testing.assert_close(gaussian_logprobs(mean, log_std.expand_as(mean), x), normal.log_prob(x))
    torch.testing.assert_close(gaussian_entropy(log_std), torch.distributions.Normal(0, log_std.exp()).entropy())
    assert math.isclose(float(gaussian_entropy(torch.zeros(1))), 0.5 * math.log(2 * math.pi * math.e), rel_tol=1e-6)


def test_the_gaussian_mode_is_the_heads_output_and_samples_spread_by_the_log_std():
    vla = l1_vla(action_log_std_init=-0.5)
    policy = vla.policy
    params = policy(vla.inputs(observations(vla))).detach()
    assert params.shape == (3, 56, 2)
    torch.testing.assert_close(params[..., 1], torch.full((3, 56), -0.5))
    dist = policy.distribution
    greedy = dist.sample(params, 1.0, True, None)
    torch.testing.assert_close(greedy, params[..., 0])
    draws = torch.stack([dist.sample(params, 1.0, False, torch.Generator().manual_seed(s)) for s in range(400)])
    spread = (draws - params[..., 0]).std()
    assert abs(float(spread) - math.exp(-0.5)) < 0.01  # 67,200 draws of N(0, e^-0.5)
    # sampled actions are clipped to [-1, 1] for the env; the mode is sent as it is (the official evaluation)
    far = np.full((1, 56), 1.7, dtype=np.float32)
    assert policy.tokens_to_actions(far, greedy=False).max() == 1.0
    assert np.isclose(policy.tokens_to_actions(far, greedy=True).max(), 1.7)


def test_an_l1_folder_keeps_the_official_side_file_and_reads_back_to_the_same_actions(tmp_path):
    vla = l1_vla()
    with torch.no_grad():
        vla.policy.action_noise.log_std.fill_(-0.25)  # a trained log-std is saved with the weights
    vla.save_pretrained(str(tmp_path))
    head_file = tmp_path / "action_head--latest_checkpoint.pt"
    state = torch.load(head_file, weights_only=True)
    assert set(state) == {"module." + n for n, _ in vla.policy.action_head.named_parameters()}  # DDP's prefix
    assert "module.model.mlp_resnet_blocks.1.ffn.1.weight" in state  # the official module's names
    back = PretrainedVLA.from_pretrained(str(tmp_path), env="reach")
    assert back.spec.action_head == "l1" and folder_action_head(str(tmp_path)) == ("l1", [])
    obs = observations(vla)
    torch.testing.assert_close(back.policy(back.inputs(obs)), vla.policy(vla.inputs(obs)), rtol=0, atol=0)
    np.testing.assert_array_equal(back.predict(obs).env_actions, vla.predict(obs).env_actions)


def test_a_folder_without_a_saved_log_std_starts_it_at_the_config_value(tmp_path):
    from safetensors.torch import load_file, save_file

    l1_vla().save_pretrained(str(tmp_path))
    weights = load_file(str(tmp_path / "model.safetensors"))
    del weights["action_noise.log_std"]  # as an official L1 fine-tune has none
    save_file(weights, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    vla = PretrainedVLA.from_pretrained(str(tmp_path), env="reach", log_std_init=-1.5)
    torch.testing.assert_close(vla.policy.action_noise.log_std.detach(), torch.full((7,), -1.5))


def test_a_token_folder_and_the_choices_that_do_not_fit_a_folder(tmp_path):
    torch.manual_seed(0)
    tokens = tmp_path / "tokens"
    fresh_vla(ModelConfig(**SMALL), instructions()).save_pretrained(str(tokens))
    assert folder_action_head(str(tokens)) == ("tokens", [])
    assert "holds no action_head--" in folder_action_head(str(tokens), "l1")[1][0]
    l1 = tmp_path / "l1"
    l1_vla().save_pretrained(str(l1))
    (problem,) = folder_action_head(str(l1), "tokens")[1]
    assert "model.action_head=l1 or auto" in problem and "token-head SFT checkpoint" in problem


def test_the_engine_samples_scores_and_acts_with_the_gaussian():
    from vla_scale.rollout.engine import RolloutEngine

    vla = l1_vla()
    engine = RolloutEngine(vla.new_policy(), seed=3, decoder=OFTDecoder())
    batch = vla.inputs(observations(vla))
    out = engine.decode(batch, temperature=1.0)
    assert out.tokens.dtype == np.float32 and out.tokens.shape == (3, 56) and out.actions.shape == (3, 8, 7)
    params = engine.policy(batch)
    expected = gaussian_logprobs(params[..., 0], params[..., 1], torch.from_numpy(out.tokens))
    np.testing.assert_array_equal(out.logprobs, expected.numpy())  # what the actor recomputes, bit for bit
    np.testing.assert_array_equal(out.actions, np.clip(out.tokens, -1, 1).reshape(3, 8, 7))
    greedy = engine.decode(batch, temperature=1.0, greedy=True)
    np.testing.assert_array_equal(greedy.tokens, params[..., 0].numpy())


def test_lora_trains_the_l1_head_whole_and_the_lm_head_never():
    from vla_scale.models.lora import add_adapters

    policy = l1_vla().new_policy()
    adapted = add_adapters(policy, LoraConfig(rank=4))
    assert adapted and not any(name.startswith("action_head") for name in adapted)
    trained = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert {n for n, _ in policy.action_head.named_parameters(prefix="action_head")} <= trained
    assert "action_noise.log_std" in trained and "language_model.lm_head.weight" not in trained
    assert not l1_vla().new_policy().language_model.lm_head.weight.requires_grad  # unused by an l1 policy


@pytest.mark.parametrize("damage", ["shapes", "two files", "diffusion", "corrupt"])
def test_a_head_file_that_cannot_be_used_is_refused_naming_it(tmp_path, damage):
    l1_vla().save_pretrained(str(tmp_path))
    head = tmp_path / "action_head--latest_checkpoint.pt"
    if damage == "shapes":
        state = torch.load(head, weights_only=True)
        state["module.model.fc1.weight"] = torch.zeros(32, 7 * 48)
        torch.save(state, head)
        phrase = "does not fit the model beside it"
    elif damage == "two files":
        os.link(head, tmp_path / "action_head--150000_checkpoint.pt")
        phrase = "holds 2 action head files"
    elif damage == "diffusion":
        torch.save({}, tmp_path / "noisy_action_projector--150000_checkpoint.pt")
        phrase = "diffusion-head fine-tune"
    else:
        head.write_bytes(head.read_bytes()[:100])
        phrase = "is unreadable"
    with pytest.raises(CheckpointError, match=phrase):
        PretrainedVLA.from_pretrained(str(tmp_path), env="reach")


def test_the_policy_line_names_the_head():
    assert "action head l1" in l1_vla().describe()
    assert "action head tokens" in fresh_vla(ModelConfig(**SMALL), instructions()).describe()


def test_the_policy_class_alone_reads_the_folders_head(tmp_path):
    from vla_scale.models.oft import OFTPolicy

    l1_vla().save_pretrained(str(tmp_path))
    policy = OFTPolicy.from_pretrained(str(tmp_path))
    assert policy.spec.action_head == "l1" and policy.action_head is not None
