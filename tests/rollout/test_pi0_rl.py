"""π0's RL rollout through the one interface: with `greedy=False` the engine's decoder samples a Flow-SDE chain (one
stochastic step per chunk, from the engine's seeded generator) and records it in `Decoded.sampled`; the source's
scorer, what the actor's update calls, gives the chunk's log-prob again, equal to the rollout's, with gradients, and
with PPO's value head the values of the PaliGemma prefix from the same pass."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from test_pi0_decode import _observations, write_tiny_pi0

from vla_scale.batches import logprob_mask
from vla_scale.config import ModelConfig
from vla_scale.models.critic import PolicyWithValue, ValueHead
from vla_scale.models.pi0.source import Pi0Source
from vla_scale.rollout.engine import RolloutEngine


def _decoded(source: Pi0Source, seed: int = 3):
    observations = _observations(3)
    images, proprio = source.processor.prepare(observations)
    prepared = source.processor.encode(images, [o.instruction for o in observations], proprio)
    engine = RolloutEngine(source.policy, "cpu", seed=seed, decoder=source.chunk_decoder())
    return prepared, engine.decode(prepared.on("cpu"), temperature=1.0, greedy=False)


def _scored(source, forward, prepared, sampled: dict[str, torch.Tensor], **critic: bool):
    """The family's scorer on the recorded chains (tokens, temperature and trimming are OFT's to read)."""
    return source.chunk_scorer().logprobs(forward, source.policy, prepared, torch.zeros(len(prepared), 1), sampled,
                                          torch.device("cpu"), 1.0, False, **critic)


def test_the_rollouts_chunk_logprob_is_scored_again_with_gradients(tmp_path: Path) -> None:
    for pi05 in (False, True):
        source = Pi0Source.from_folder(str(write_tiny_pi0(tmp_path / f"pi05_{pi05}", pi05)), "pick_place")
        source.noise_level = 0.7
        spec = source.spec
        prepared, decoded = _decoded(source)
        chain, stochastic, level = (decoded.sampled[k] for k in ("chain", "stochastic", "noise_level"))
        assert chain.shape == (3, spec.num_steps + 1, spec.action_horizon, spec.action_dim)
        assert stochastic.shape == (3, spec.num_steps) and stochastic.sum(axis=1).tolist() == [1, 1, 1]
        assert level.tolist() == [np.float32(0.7)] * 3
        assert decoded.logprobs.shape == (3, 1) and np.isfinite(decoded.logprobs).all() and decoded.logprobs.any()
        np.testing.assert_array_equal(decoded.tokens.reshape(3, -1, 7), chain[:, -1, :, :7])
        _, again = _decoded(source)  # the same seed, the same chain
        np.testing.assert_array_equal(again.sampled["chain"], chain)

        policy = source.new_policy()  # the actor's copy: the same weights, trainable
        sampled = {k: torch.from_numpy(v) for k, v in decoded.sampled.items()}
        logprobs, entropy, values = _scored(source, policy, prepared, sampled)
        assert values is None
        assert logprobs.shape == entropy().shape == (3, 1)
        torch.testing.assert_close(logprobs.detach(), torch.from_numpy(decoded.logprobs), rtol=0, atol=1e-4)
        logprobs.sum().backward()
        grads = [p.grad for p in policy.parameters() if p.grad is not None]
        assert grads and any(bool(g.abs().sum() > 0) for g in grads)


def test_every_step_stochastic_scores_the_whole_chain(tmp_path: Path) -> None:
    """`model.pi0.stochastic_steps=all`: every denoising step is a transition; the chunk's log-prob and entropy sum
    all K steps', and the scorer gives the rollout's log-prob again."""
    source = Pi0Source.from_folder(str(write_tiny_pi0(tmp_path / "pi0", False)), "pick_place")
    source.stochastic_steps = "all"
    prepared, decoded = _decoded(source)
    assert decoded.sampled["stochastic"].all()
    policy = source.new_policy()
    sampled = {k: torch.from_numpy(v) for k, v in decoded.sampled.items()}
    logprobs, entropy, _ = _scored(source, policy, prepared, sampled)
    torch.testing.assert_close(logprobs.detach(), torch.from_numpy(decoded.logprobs), rtol=0, atol=1e-3)
    # K Gaussians' entropies over the chunk's played elements, each step's std a * sqrt(t / max(1 - t, 1/K) / K)
    k, level = source.spec.num_steps, float(decoded.sampled["noise_level"][0])
    times = 1.0 - np.arange(k) / k
    std = level * np.sqrt(times / np.maximum(1.0 - times, 1.0 / k) / k)
    elements = float(source.chunk_scorer().mask.sum())
    expected = elements * np.sum(0.5 * (1.0 + np.log(2.0 * np.pi)) + np.log(std))
    np.testing.assert_allclose(entropy().numpy(), np.full((3, 1), expected), rtol=1e-5)
    with pytest.raises(ValueError, match="stochastic_steps='some'"):
        source.stochastic_steps = "some"
        source.chunk_decoder()


def test_a_chunk_level_record_is_masked_per_chunk() -> None:
    model = ModelConfig(chunk_len=4, action_dim=7)
    executed = torch.tensor([4, 2, 0])
    assert logprob_mask(executed, 1, model).tolist() == [[True], [True], [False]]
    assert logprob_mask(executed, 28, model).shape == (3, 28)


def test_the_value_head_reads_the_prefix_in_the_scorers_pass(tmp_path: Path) -> None:
    source = Pi0Source.from_folder(str(write_tiny_pi0(tmp_path / "pi0")), "pick_place")
    prepared, decoded = _decoded(source)
    sampled = {k: torch.from_numpy(v) for k, v in decoded.sampled.items()}
    cpu = torch.device("cpu")
    for position in ("prompt_last", "action_mean"):
        policy = source.new_policy()
        head = ValueHead(source.value_width, 16, position)
        torch.nn.init.normal_(head.net[-1].weight)  # a trained head's: not the fresh zero
        model = PolicyWithValue(policy, head)
        logprobs, _, values = _scored(source, model, prepared, sampled, detach_backbone=False)
        alone, _, _ = _scored(source, policy, prepared, sampled)
        torch.testing.assert_close(logprobs, alone, rtol=0, atol=0)  # the log-probs as without a critic
        _, pad, out = policy.prefix_pass(prepared.on(cpu))
        valid = pad.nonzero()
        last = [int(valid[valid[:, 0] == b, 1].max()) for b in range(len(pad))]
        read = out[torch.arange(len(out)), last] if position == "prompt_last" else torch.stack(
            [out[b, pad[b]].mean(dim=0) for b in range(len(pad))])
        assert values is not None and values.shape == (3,)
        torch.testing.assert_close(values, head(read).detach(), rtol=1e-5, atol=1e-6)
        values.sum().backward()  # the value loss reaches the backbone ...
        assert policy.paligemma_with_expert.language_model.layers[0].mlp.down_proj.weight.grad.abs().sum() > 0
        assert policy.action_out_proj.weight.grad is None  # ... through the prefix alone
        policy.zero_grad(set_to_none=True)
        _, _, detached = _scored(source, model, prepared, sampled, detach_backbone=True)
        detached.sum().backward()
        assert all(p.grad is None for p in policy.parameters()) and head.net[0].weight.grad is not None
