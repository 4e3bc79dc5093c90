"""RLOO's leave-one-out advantages by hand, and through the one update: planned from a step's episodes, each chunk
step carries its episode's advantage."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vla_scale.algo.grpo import group_advantages
from vla_scale.algo.registry import make_algorithm
from vla_scale.algo.rloo import leave_one_out_advantages
from vla_scale.batches import Trajectory
from vla_scale.config import AlgoConfig, ModelConfig
from vla_scale.envs.reach import instructions
from vla_scale.envs.types import TaskSpec
from vla_scale.models.oft import Processor
from vla_scale.models.tokenizer import WordTokenizer
from vla_scale.run_policy import spec_from_model_config


def test_leave_one_out_by_hand_with_interleaved_groups() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0])
    uids = ["a", "b", "a", "b", "a", "c"]
    # a: 1, 0, 1 -> 1 - 0.5, 0 - 1, 1 - 0.5; b: 0, 1 -> -1, 1; c alone -> 0
    expected = torch.tensor([0.5, -1.0, -1.0, 1.0, 0.5, 0.0])
    assert torch.equal(leave_one_out_advantages(rewards, uids), expected)


def test_leave_one_out_is_the_scaled_deviation_from_the_group_mean() -> None:
    """n / (n - 1) * (r_i - mean): verl's form of the same baseline; GRPO divides the deviation by the std instead."""
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0])
    uids = ["g"] * 8
    n, mean = 8, float(rewards.mean())
    assert torch.allclose(leave_one_out_advantages(rewards, uids), n / (n - 1) * (rewards - mean), atol=1e-7)
    assert not torch.allclose(leave_one_out_advantages(rewards, uids), group_advantages(rewards, uids))
    assert leave_one_out_advantages(torch.tensor([1, 0]), ["g", "g"]).dtype == torch.float32
    assert torch.equal(leave_one_out_advantages(torch.ones(4), ["g"] * 4), torch.zeros(4))
    with pytest.raises(ValueError, match="uids"):
        leave_one_out_advantages(torch.ones(3), ["g"] * 2)


CFG = ModelConfig(image_size=32, patch_size=8, vision_dim=32, hidden_size=32, num_layers=2, num_heads=2,
                  intermediate_size=64, chunk_len=4)


def _episode(seed: int, uid: str, steps: int, success: bool) -> Trajectory:
    rng = np.random.default_rng(seed)
    traj = Trajectory(TaskSpec("reach", 0, seed), uid, instructions()[0])
    for _ in range(steps):
        traj.images.append(rng.integers(0, 256, (1, 32, 32, 3), dtype=np.uint8))
        traj.proprio.append(rng.uniform(-1, 1, CFG.proprio_dim).astype(np.float32))
        traj.tokens.append(rng.integers(0, 256, CFG.chunk_len * 7))
        traj.logprobs.append(np.full(CFG.chunk_len * 7, -5.5, dtype=np.float32))
        traj.executed.append(CFG.chunk_len)
        traj.rewards.append(0.0)
        traj.versions.append(0)
    traj.success = success
    return traj


def test_the_planned_update_carries_each_episodes_leave_one_out_advantage_and_no_final_rows() -> None:
    tok = WordTokenizer.from_instructions(instructions())
    processor = Processor.for_spec(spec_from_model_config(CFG, tok.vocab_size, tok.eos_id), tok, max_text_len=40)
    outcomes = [True, False, False, True, True, True]
    episodes = [_episode(i, f"g{i // 3}", 2 + i % 2, s) for i, s in enumerate(outcomes)]
    algo = AlgoConfig(name="rloo", group_size=3, mini_batches=2, micro_batches=2)
    plan = make_algorithm(algo).plan(episodes, CFG, processor, lambda x: x)
    expected = [0.0 + 1.0 - 0.0, -0.5, -0.5, 0.0, 0.0, 0.0]  # g0: 1, 0, 0; g1: 1, 1, 1
    expected[0] = 1.0
    rows = [(e, t, float(a)) for mini in plan.minis for micro in mini.micro_batches
            for e, t, a in zip(micro.rows.episode.tolist(), micro.rows.step.tolist(), micro.advantages, strict=True)]
    assert sorted((e, t) for e, t, _ in rows) == [(e, t) for e, traj in enumerate(episodes) for t in range(len(traj))]
    assert all(a == expected[e] for e, _, a in rows)
    assert make_algorithm(algo).prepare(plan, [[None]] * 2, [], lambda x: x).minis == plan.minis
