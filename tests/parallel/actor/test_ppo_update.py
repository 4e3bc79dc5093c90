"""PPO through the one update (tiny model, CPU, fp32): the plan's rows (a truncated episode's final
observation among them, read by the proximal pass only), PPO's advantages and targets from the critic's values by
hand, a value head that learns its returns, a warm-up that moves the value head alone, and the shared backbone
learning from the value loss unless detached."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from vla_scale.algo.ppo import chunk_gae, with_critic_targets
from vla_scale.algo.registry import make_algorithm
from vla_scale.batches import Trajectory, UpdatePlan
from vla_scale.config import AlgoConfig, DeepSpeedConfig, ModelConfig
from vla_scale.envs.reach import instructions
from vla_scale.envs.types import TaskSpec
from vla_scale.models.oft import Processor
from vla_scale.models.oft.decode import OFTScorer
from vla_scale.models.tokenizer import WordTokenizer
from vla_scale.parallel.actor import Actor
from vla_scale.parallel.sync.weight_sync import gathered_buckets
from vla_scale.run_policy import build_policy, spec_from_model_config
from vla_scale.run_setup import init_distributed
from vla_scale.tensors.checksum import weights_checksum

CFG = ModelConfig(image_size=32, patch_size=8, vision_dim=32, hidden_size=32, num_layers=2, num_heads=2,
                  intermediate_size=64, chunk_len=4)
TOK = WordTokenizer.from_instructions(instructions())
SPEC = spec_from_model_config(CFG, TOK.vocab_size, TOK.eos_id)
PROCESSOR = Processor.for_spec(SPEC, TOK, max_text_len=40)
PPO = AlgoConfig(name="ppo", group_size=1, filter_low=0.0, filter_high=1.0, max_resample_rounds=0, mini_batches=1,
                 micro_batches=2, loss_agg="trajectory_mean", old_logprobs="recompute", temperature=1.0, lr=1e-3,
                 weight_decay=0.1, gamma=0.9, gae_lambda=0.8)


def one(x: float) -> float:
    return x


def planned(episodes: list[Trajectory], algo: AlgoConfig) -> UpdatePlan:
    """The update of `episodes` as `algo.name`'s algorithm plans it."""
    return make_algorithm(algo).plan(episodes, CFG, PROCESSOR, one)


def episode(seed: int, steps: int, success: bool) -> Trajectory:
    """An episode of `steps` chunk steps as the env loop records it: reward 1 on the last chunk when it succeeds,
    and a truncated one's final observation."""
    rng = np.random.default_rng(seed)
    k = CFG.chunk_len * 7

    def image() -> np.ndarray:
        return rng.integers(0, 256, (1, 32, 32, 3), dtype=np.uint8)

    traj = Trajectory(TaskSpec("reach", 0, seed), f"u{seed}", instructions()[seed % len(instructions())])
    for t in range(steps):
        traj.images.append(image())
        traj.proprio.append(rng.uniform(-1, 1, CFG.proprio_dim).astype(np.float32))
        traj.tokens.append(rng.integers(0, 256, k))
        traj.logprobs.append(rng.normal(-5.5, 0.3, k).astype(np.float32))
        traj.versions.append(0)
        last = t == steps - 1
        traj.executed.append(3 if last and success else CFG.chunk_len)
        traj.rewards.append(1.0 if last and success else 0.0)
    traj.success = success
    if not success:
        traj.final_images = image()
        traj.final_proprio = rng.uniform(-1, 1, CFG.proprio_dim).astype(np.float32)
    return traj


EPISODES = [episode(0, 2, True), episode(1, 3, False), episode(2, 1, True), episode(3, 2, False)]


def actor(algo: AlgoConfig = PPO, zero_stage: int = 3) -> Actor:
    init_distributed()
    torch.manual_seed(0)
    return Actor(lambda zero3: build_policy(CFG, TOK, zero3), DeepSpeedConfig(zero_stage=zero_stage), algo,
                 scorer=OFTScorer())


def checksum(module: torch.nn.Module) -> str:
    return weights_checksum([(n, t.clone()) for b in gathered_buckets(module, 1) for n, t in b])


def test_the_plan_has_every_chunk_step_and_each_truncated_episodes_final_observation():
    plan = planned(EPISODES, PPO)
    micros = [micro for mini in plan.minis for micro in mini.micro_batches]
    rows = [micro.rows for micro in micros]
    keys = sorted((e, t, b) for r in rows
                  for e, t, b in zip(r.episode.tolist(), r.step.tolist(), r.final.tolist(), strict=True))
    assert keys == [(0, 0, False), (0, 1, False), (1, 0, False), (1, 1, False), (1, 2, False), (1, 3, True),
                    (2, 0, False), (3, 0, False), (3, 1, False), (3, 2, True)]
    values = [[torch.zeros(len(micro.inputs)) for micro in mini.micro_batches] for mini in plan.minis]
    minis, _ = with_critic_targets(plan, values, PPO, one)
    for micro in (micro for mini in minis for micro in mini.micro_batches):
        final = micro.rows.final
        assert not micro.mask[final].any() and float(micro.targets["value_weights"][final].sum()) == 0.0
    weights = sum(float(micro.targets["value_weights"].sum()) for mini in minis for micro in mini.micro_batches)
    assert weights == pytest.approx(1.0)  # 8 chunk steps
    grpo = planned(EPISODES, replace(PPO, name="grpo", group_size=2))
    assert sum(len(micro.inputs) for mini in grpo.minis for micro in mini.micro_batches) == 8  # no final rows
    assert not any(bool(micro.rows.final.any()) for mini in grpo.minis for micro in mini.micro_batches)


def test_advantages_and_targets_come_from_the_values_by_hand():
    """Values given per row: GAE per episode (terminated: V_T = 0; truncated: its final observation's value), then
    normalised over every chunk step; the returns are the unnormalised advantages plus the values."""
    plan = planned(EPISODES, PPO)
    value_of = {(e, t): 0.1 * e + 0.05 * t for e in range(4) for t in range(4)}
    values = [[torch.tensor([value_of[(e, t)] for e, t in zip(micro.rows.episode.tolist(), micro.rows.step.tolist(),
                                                               strict=True)])
               for micro in mini.micro_batches] for mini in plan.minis]
    minis, metrics = with_critic_targets(plan, values, PPO, one)
    expected = {}
    for e, traj in enumerate(EPISODES):
        v = torch.tensor([value_of[(e, t)] for t in range(len(traj))], dtype=torch.float64)
        v = v.float().double()  # the values as the critic gives them (float32)
        last = float(torch.tensor(value_of[(e, len(traj))]).float())
        a, r = chunk_gae(torch.tensor(traj.rewards, dtype=torch.float64), v, last, traj.success, 0.9, 0.8)
        expected.update({(e, t): (float(a[t]), float(r[t]), float(v[t])) for t in range(len(traj))})
    raw = torch.tensor([a for a, _, _ in expected.values()], dtype=torch.float64)
    mean, std = float(raw.mean()), float(raw.std(correction=0))
    assert metrics["advantage_mean"] == pytest.approx(mean) and metrics["advantage_std"] == pytest.approx(std)
    for mini in minis:
        for micro in mini.micro_batches:
            for row, (e, t, final) in enumerate(zip(micro.rows.episode.tolist(), micro.rows.step.tolist(),
                                                    micro.rows.final.tolist(), strict=True)):
                if final:
                    assert micro.advantages[row] == 0 and micro.targets["returns"][row] == 0
                    continue
                a, r, v = expected[(e, t)]
                assert micro.advantages[row].item() == pytest.approx((a - mean) / (std + 1e-8), rel=1e-5)
                assert micro.targets["returns"][row].item() == pytest.approx(r, rel=1e-5)
                assert micro.targets["old_values"][row].item() == pytest.approx(v, rel=1e-5)


def test_without_bootstrapping_the_step_limit_ends_an_episode_as_a_success_does():
    """`algo.critic.bootstrap_truncated=false`: no final-observation rows, and a truncated episode's GAE has V_T = 0."""
    algo = replace(PPO, critic=replace(PPO.critic, bootstrap_truncated=False))
    plan = planned(EPISODES, algo)
    assert not any(bool(micro.rows.final.any()) for mini in plan.minis for micro in mini.micro_batches)
    values = [[torch.full((len(micro.inputs),), 0.5) for micro in mini.micro_batches] for mini in plan.minis]
    minis, _ = with_critic_targets(plan, values, replace(algo, normalize_advantages=False), one)
    returns = {(e, t): float(r) for mini in minis for micro in mini.micro_batches
               for e, t, r in zip(micro.rows.episode.tolist(), micro.rows.step.tolist(), micro.targets["returns"],
                                  strict=True)}
    # episode 1: three chunks, no reward, truncated, every value 0.5, gamma 0.9, lambda 0.8, V_3 = 0:
    # deltas -0.05, -0.05, -0.5; advantages -0.3452, -0.41, -0.5; returns 0.1548, 0.09, 0 (bootstrapped: 0.45 last)
    assert [returns[(1, t)] for t in range(3)] == pytest.approx([0.1548, 0.09, 0.0], abs=1e-6)


@pytest.mark.parametrize("zero_stage", [3, 0])
def test_warm_up_trains_the_value_head_alone_then_both_learn(zero_stage):
    """In the critic's warm-up the policy keeps its weights (even under weight decay) while the value head moves
    and its loss falls on the same batch; after it, the policy trains too."""
    warming = replace(PPO, critic=replace(PPO.critic, warmup_steps=3, lr=3e-3))
    a = actor(warming, zero_stage)
    plan = planned(EPISODES, warming)
    policy, head = checksum(a.policy), checksum(a.value_head)
    losses = []
    for step in range(3):
        result = a.update(plan, step)
        assert result.algorithm["critic_warmup"] == 1.0
        losses.append(result.algorithm["value_loss"])
    assert checksum(a.policy) == policy and checksum(a.value_head) != head
    assert losses[-1] < losses[0]
    after = a.update(plan, 3)
    assert after.algorithm["critic_warmup"] == 0.0 and checksum(a.policy) != policy
    assert after.samples == 8  # the chunk steps: the final observations' rows only had their values read
    assert set(after.metrics()) >= {"value_loss", "value_clip_frac", "explained_variance", "value_mean",
                                    "return_mean", "advantage_mean", "advantage_std", "critic_warmup"}


def test_the_value_loss_reaches_the_backbone_unless_detached():
    """A shared backbone gets the value loss's gradient; a detached one (`algo.critic.detach_backbone`, and every
    warm-up step) none, while the value head gets it either way."""
    from vla_scale.models.critic import PolicyWithValue, ValueHead

    torch.manual_seed(0)
    model = PolicyWithValue(build_policy(CFG, TOK), ValueHead(32, 16, "action_mean"))
    torch.nn.init.normal_(model.value_head.net[-1].weight)  # a head that has learnt something
    plan = planned(EPISODES, PPO)
    inputs = plan.minis[0].micro_batches[0].inputs
    for detach in (False, True):
        model.zero_grad()
        _, values = model(inputs, detach_backbone=detach)
        values.square().sum().backward()
        backbone = model.policy.language_model.model.layers[0].mlp.down_proj.weight.grad
        assert (backbone is not None and bool(backbone.abs().sum() > 0)) == (not detach)
        assert model.value_head.net[0].weight.grad.abs().sum() > 0


def test_an_update_without_a_critic_is_grpos():
    a = actor(replace(PPO, name="grpo", group_size=2))
    assert a.value_head is None
    result = a.update(planned(EPISODES, replace(PPO, name="grpo", group_size=2)))
    assert result.algorithm == {} and "value_loss" not in result.metrics()


def test_an_empty_plan_is_no_update():
    assert planned([], PPO) == UpdatePlan(())
