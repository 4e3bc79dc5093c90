"""π0's RL with Flow-Noise (`model.pi0.rl_noise=flow_noise`) on the tiny shapes: each step of the chain is the Euler
step plus Gaussian noise of the noise head's std, which stays within its bounds; the scorer gives the rollout's
chunk log-prob again with gradients into the policy and the noise head, and the entropy of the learned stds; the
noise head leaves evaluation as it was; it travels beside the openpi-layout weights of a checkpoint folder (an SFT
folder starts it fresh, a policy without one ignores it); LoRA trains it whole; the config keys are checked."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from test_pi0_decode import ROOT, _observations, write_tiny_pi0

from vla_scale.config import ConfigError, ModelConfig, register_configs, to_config, validate
from vla_scale.models.families import CheckpointFolderError
from vla_scale.models.pi0.noise_head import FILE, PREFIX, STD_BOUNDS, NoiseHead
from vla_scale.models.pi0.policy import Pi0Inputs, Pi0Policy
from vla_scale.models.pi0.source import Pi0Source
from vla_scale.models.pi0.spec import tiny_spec
from vla_scale.objectives.flow_noise import bounded_std
from vla_scale.objectives.flow_sde import euler_times
from vla_scale.rollout.engine import RolloutEngine

LOW, HIGH = STD_BOUNDS


def _source(folder: Path) -> Pi0Source:
    source = Pi0Source.from_folder(str(folder), "pick_place")
    source.rl_noise = "flow_noise"
    return source


def _decode(source: Pi0Source, greedy: bool = False, seed: int = 3):
    observations = _observations(3)
    images, proprio = source.processor.prepare(observations)
    prepared = source.processor.encode(images, [o.instruction for o in observations], proprio)
    engine = RolloutEngine(source.policy, "cpu", seed=seed, decoder=source.chunk_decoder())
    return prepared, engine.decode(prepared.on("cpu"), temperature=1.0, greedy=greedy)


def _actor(source: Pi0Source) -> Pi0Policy:
    """The actor's copy of the engine's policy (the weight sync's job in a run: a fresh noise head is drawn anew)."""
    actor = source.new_policy()
    actor.load_state_dict(source.policy.state_dict())
    return actor


def _score(source: Pi0Source, forward, prepared, sampled: dict[str, np.ndarray]):
    tensors = {k: torch.from_numpy(v) for k, v in sampled.items()}
    return source.chunk_scorer().logprobs(forward, source.policy, prepared, torch.zeros(len(prepared), 1), tensors,
                                          torch.device("cpu"), 1.0, False)


@pytest.mark.parametrize("pi05", [False, True], ids=["pi0", "pi05"])
def test_the_scorer_gives_the_rollouts_logprob_with_gradients_into_the_noise_head(tmp_path: Path, pi05: bool):
    source = _source(write_tiny_pi0(tmp_path / "sft", pi05))
    spec = source.spec
    prepared, decoded = _decode(source)
    assert sorted(decoded.sampled) == ["chain", "stochastic"]  # the std is the weights': no noise level recorded
    assert decoded.sampled["chain"].shape == (3, spec.num_steps + 1, spec.action_horizon, spec.action_dim)
    assert decoded.sampled["stochastic"].all()  # every step, the whole chain's likelihood
    assert np.isfinite(decoded.logprobs).all() and decoded.logprobs.any()

    actor = _actor(source)
    logprobs, entropy, values = _score(source, actor, prepared, decoded.sampled)
    assert values is None and logprobs.shape == entropy().shape == (3, 1)
    torch.testing.assert_close(logprobs.detach(), torch.from_numpy(decoded.logprobs), rtol=1e-6, atol=1e-3)
    logprobs.sum().backward()
    head = [p.grad for n, p in actor.named_parameters() if n.startswith(PREFIX)]
    assert len(head) == 6 and all(g is not None and g.abs().sum() > 0 for g in head)
    for name in ("action_in_proj.weight", "action_out_proj.weight"):  # the policy trains through the same pass
        grad = actor.get_parameter(name).grad
        assert grad is not None and grad.abs().sum() > 0, name

    source.stochastic_steps = "one"  # RLinf's flow_noise without joint_logprob: one learned-std step per chunk
    prepared, decoded = _decode(source)
    assert decoded.sampled["stochastic"].sum(axis=1).tolist() == [1, 1, 1]
    logprobs, _, _ = _score(source, _actor(source), prepared, decoded.sampled)
    torch.testing.assert_close(logprobs.detach(), torch.from_numpy(decoded.logprobs), rtol=1e-6, atol=1e-4)


def test_each_step_is_the_euler_step_plus_the_heads_noise_and_the_entropy_its_gaussians(tmp_path: Path):
    """The chain and the entropy by hand: x_{k+1} = x_k + dt * v_k + std_k * eps_k with std_k the head's of the
    expert's rows at x_k, and the scorer's entropy is torch's Normal entropy of those stds over the chunk mask."""
    source = _source(write_tiny_pi0(tmp_path / "sft"))
    prepared, decoded = _decode(source)
    policy, inputs = source.policy, prepared.on("cpu")
    chain = torch.from_numpy(decoded.sampled["chain"])
    steps = chain.shape[1] - 1
    mask = source.chunk_scorer().mask
    times, dt = euler_times(steps)
    entropy = torch.zeros(3)
    with torch.no_grad():
        cache, pad = policy.prefix_cache(inputs)
        for k in range(steps):
            rows = policy.suffix_rows(inputs.state, pad, cache, chain[:, k], times[k].expand(3))
            std = policy.noise_head(rows)
            assert ((std >= LOW * (1 - 1e-6)) & (std <= HIGH * (1 + 1e-6))).all()
            mean = chain[:, k] + dt * policy.velocity(rows)
            noise = (chain[:, k + 1] - mean) / std
            assert noise.abs().max() < 6 and 0.5 < float(noise.std()) < 1.5  # standard normal draws
            entropy += torch.distributions.Normal(mean, std).entropy()[:, mask].sum(dim=1)
    _, entropy_of, _ = _score(source, _actor(source), prepared, decoded.sampled)
    torch.testing.assert_close(entropy_of()[:, 0], entropy, rtol=1e-5, atol=1e-4)


def test_the_std_stays_within_its_bounds():
    assert bounded_std(torch.tensor([-1e4, 0.0, 1e4]), LOW, HIGH).tolist() == pytest.approx(
        [LOW, math.sqrt(LOW * HIGH), HIGH], rel=1e-6)
    torch.manual_seed(0)
    head = NoiseHead(32, 8, LOW, HIGH)
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0.0, 3.0)  # far beyond any init: the outputs saturate at both ends
    with torch.no_grad():
        std = head(torch.randn(64, 4, 32) * 10)
    assert std.dtype == torch.float32 and std.shape == (64, 4, 8)
    assert float(std.min()) >= LOW * (1 - 1e-6) and float(std.max()) <= HIGH * (1 + 1e-6)
    assert float(std.min()) < LOW * 1.01 and float(std.max()) > HIGH * 0.99
    with pytest.raises(ValueError, match="std_min <= std_max"):
        NoiseHead(32, 8, 0.2, 0.1)


@pytest.mark.parametrize("pi05", [False, True], ids=["pi0", "pi05"])
def test_evaluation_is_sample_actions_unchanged_by_the_noise_head(pi05: bool):
    torch.manual_seed(0)
    spec = tiny_spec(pi05, max_token_len=24)
    plain = Pi0Policy.from_spec(spec).eval()
    with_head = Pi0Policy.from_spec(spec, noise_std=STD_BOUNDS).eval()
    assert {n for n in with_head.state_dict() if not n.startswith(PREFIX)} == set(plain.state_dict())
    with_head.load_state_dict(plain.state_dict(), strict=False)
    with torch.no_grad():
        for n, p in with_head.named_parameters():
            if n.startswith(PREFIX):
                p.normal_(0.0, 1.0)
    x = _inputs(plain)
    noise = plain.sample_noise(3, generator=torch.Generator().manual_seed(2))
    assert torch.equal(with_head.sample_actions(x, noise), plain.sample_actions(x, noise))
    none = torch.zeros(3, spec.num_steps, dtype=torch.bool)  # no step stochastic: the Euler chain bit for bit
    chain = with_head.sample_chain(x, noise, stochastic=none, generator=torch.Generator().manual_seed(3))
    assert torch.equal(chain.actions, plain.sample_actions(x, noise)) and not chain.logprobs.any()


def _inputs(policy: Pi0Policy) -> Pi0Inputs:
    g, s = torch.Generator().manual_seed(1), policy.spec
    side = s.vision.image_size
    return Pi0Inputs(images=torch.rand(3, s.num_images, 3, side, side, generator=g) * 2 - 1,
                     image_masks=torch.tensor([[True, True, False], [True, False, True], [True, True, True]]),
                     tokens=torch.randint(1, s.vocab_size, (3, s.max_token_len), generator=g),
                     token_masks=torch.arange(s.max_token_len)[None] < torch.tensor([[3], [s.max_token_len], [7]]),
                     state=torch.randn(3, s.action_dim, generator=g))


def test_the_engines_greedy_decode_is_the_same_with_and_without_flow_noise(tmp_path: Path):
    folder = write_tiny_pi0(tmp_path / "sft")
    _, plain = _decode(Pi0Source.from_folder(str(folder), "pick_place"), greedy=True)
    _, noisy = _decode(_source(folder), greedy=True)
    np.testing.assert_array_equal(noisy.actions, plain.actions)
    assert noisy.sampled == {} and not noisy.logprobs.any()
    mixed = Pi0Source.from_folder(str(folder), "pick_place")
    assert mixed.policy.noise_head is None  # built without a noise head, then asked for Flow-Noise chains
    mixed.rl_noise = "flow_noise"
    with pytest.raises(ValueError, match="rl_noise=flow_noise but the policy lacks a noise head"):
        _decode(mixed)


def test_the_noise_head_travels_beside_the_weights_and_a_policy_without_one_ignores_it(tmp_path: Path):
    sft = write_tiny_pi0(tmp_path / "sft")
    source = _source(sft)
    assert f"freshly initialised ({sft} has no {FILE})" in source.describe()
    torch.manual_seed(5)
    trained = source.new_policy()
    with torch.no_grad():
        for n, p in trained.named_parameters():
            if n.startswith(PREFIX):
                p.normal_(0.0, 0.5)
    run = tmp_path / "run"
    source.write_folder(trained, dict(trained.state_dict()), str(run))
    from safetensors import safe_open

    with safe_open(str(run / "model.safetensors"), "pt") as weights, safe_open(str(run / FILE), "pt") as head:
        assert not any(k.startswith(PREFIX) for k in weights.keys())  # openpi's layout as it is
        assert sorted(head.keys()) == sorted(n for n in trained.state_dict() if n.startswith(PREFIX))

    again = _source(run)
    assert f"from {run / FILE}" in again.describe()
    loaded = again.new_policy()
    for name, tensor in trained.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    flow_sde = Pi0Source.from_folder(str(run), "pick_place")  # evaluation, a Flow-SDE run: the file is ignored
    plain = flow_sde.new_policy()
    assert plain.noise_head is None and "Flow-Noise" not in flow_sde.describe()
    for name, tensor in plain.state_dict().items():
        assert torch.equal(tensor, trained.state_dict()[name]), name

    (run / FILE).write_bytes(b"not safetensors")
    with pytest.raises(CheckpointFolderError, match="remove it to start a fresh noise head"):
        _source(run).new_policy()


def test_lora_trains_the_noise_head_whole():
    from vla_scale.config import LoraConfig
    from vla_scale.models.lora import add_adapters

    policy = Pi0Policy.from_spec(tiny_spec(), noise_std=STD_BOUNDS)
    adapted = add_adapters(policy, LoraConfig(rank=4))
    assert not any(n.startswith("noise_head") for n in adapted)
    assert all(p.requires_grad for n, p in policy.named_parameters() if n.startswith(PREFIX))


def _config(*overrides: str):
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return to_config(compose(config_name="config", overrides=list(overrides)))


def test_the_config_keys_are_checked_and_their_defaults_are_rlinfs():
    pi0 = ModelConfig().pi0
    assert (pi0.rl_noise, pi0.stochastic_steps, (pi0.noise_std_min, pi0.noise_std_max)) == ("flow_sde", "", STD_BOUNDS)
    validate(_config("model.pi0.rl_noise=flow_noise"))
    with pytest.raises(ConfigError, match=r"model.pi0.rl_noise='reinflow': choose one of \['flow_sde', 'flow_noise'\]"):
        validate(_config("model.pi0.rl_noise=reinflow"))
    with pytest.raises(ConfigError, match="model.pi0.noise_std_min=0.3 exceeds model.pi0.noise_std_max=0.16"):
        validate(_config("model.pi0.noise_std_min=0.3"))
    with pytest.raises(ConfigError, match="model.pi0.noise_std_min=0.0 must be > 0"):
        validate(_config("model.pi0.noise_std_min=0"))
    with pytest.raises(ConfigError, match="model.pi0.stochastic_steps='some'"):
        validate(_config("model.pi0.stochastic_steps=some"))


def test_ppos_value_head_reads_the_same_pass_and_leaves_the_logprobs_and_entropy_as_they_are(tmp_path: Path):
    from vla_scale.models.critic import PolicyWithValue, ValueHead

    source = _source(write_tiny_pi0(tmp_path / "sft"))
    prepared, decoded = _decode(source)
    actor = _actor(source)
    tensors = {k: torch.from_numpy(v) for k, v in decoded.sampled.items()}
    scorer, cpu = source.chunk_scorer(), torch.device("cpu")
    model = PolicyWithValue(actor, ValueHead(source.value_width, 16, "prompt_last"))
    logprobs, entropy, values = scorer.logprobs(model, actor, prepared, torch.zeros(3, 1), tensors, cpu, 1.0, False,
                                                detach_backbone=False)
    alone, alone_entropy, _ = _score(source, actor, prepared, decoded.sampled)
    assert values is not None and values.shape == (3,)
    torch.testing.assert_close(logprobs, alone, rtol=0, atol=0)
    torch.testing.assert_close(entropy(), alone_entropy(), rtol=0, atol=0)


def test_a_bfloat16_flow_noise_policy_samples_and_scores_in_float32():
    """What DeepSpeed's bf16 engine holds: the noise head in bfloat16 too, its stds and the log-probs float32."""
    torch.manual_seed(0)
    policy = Pi0Policy.from_spec(tiny_spec(num_steps=3), dtype=torch.bfloat16, noise_std=STD_BOUNDS)
    assert policy.noise_head is not None and policy.noise_head.net[0].weight.dtype == torch.bfloat16
    x = _inputs(policy)
    chain = policy.sample_chain(x, policy.sample_noise(3, generator=torch.Generator().manual_seed(2)),
                                generator=torch.Generator().manual_seed(3))
    steps, entropy = policy.chain_logprobs(x, chain.chain, with_entropy=True)
    assert steps.dtype == entropy.dtype == chain.logprobs.dtype == torch.float32
    assert torch.isfinite(steps).all() and torch.isfinite(entropy).all() and chain.logprobs.all()
