"""The actor's GRPO update (tiny model, ZeRO-3 on CPU, fp32): where the old log-probs come from and what the
truncated importance weights and the mismatch are, checked by hand; its faster paths compute the update they replace
(old log-probs read off the update's own forward instead of a recompute pass, prompt padding trimmed per
micro-batch, micro-batches counted by the update rather than by the config); the batches it takes stay as they
were."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from vla_scale.batches import MicroBatch, MiniBatch, RowIndex, UpdatePlan
from vla_scale.config import AlgoConfig, DeepSpeedConfig, ModelConfig
from vla_scale.envs.reach import instructions
from vla_scale.models.oft import Processor
from vla_scale.models.oft.decode import OFTScorer
from vla_scale.models.tokenizer import WordTokenizer
from vla_scale.objectives import clipped_policy_loss, logprob_mismatch, truncated_is_weights
from vla_scale.parallel.actor import Actor
from vla_scale.parallel.sync.weight_sync import gathered_buckets
from vla_scale.run_policy import build_policy, spec_from_model_config
from vla_scale.run_setup import init_distributed
from vla_scale.tensors.checksum import weights_checksum

CFG = ModelConfig(image_size=32, patch_size=8, vision_dim=32, hidden_size=32, num_layers=2, num_heads=2,
                  intermediate_size=64, chunk_len=4)
TOK = WordTokenizer.from_instructions(instructions())
SPEC = spec_from_model_config(CFG, TOK.vocab_size, TOK.eos_id)
ALGO = AlgoConfig(micro_batches=2, tis_cap=1.5, old_logprobs="recompute", temperature=1.3)


def texts(n: int) -> list[str]:
    """Prompts of different lengths (one instruction up to three in a row), so the batch's rows differ."""
    base = instructions()
    return [" ".join([base[i % len(base)]] * (1 + i % 3)) for i in range(n)]


def micro_batch(seed: int, rows: int = 4, head: str = "tokens") -> MicroBatch:
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (rows, 32, 32, 3), dtype=np.uint8)
    proprio = rng.uniform(-1, 1, (rows, CFG.proprio_dim)).astype(np.float32)
    processor = Processor.for_spec(SPEC, TOK, max_text_len=40)  # a suite's prompt budget
    inputs = processor.encode(processor.transform.prepare(images[:, None]), texts(rows), proprio)
    k = CFG.chunk_len * 7
    if head == "l1":  # the Gaussian's draws: normalised action values
        tokens = torch.from_numpy(rng.normal(0, 1, (rows, k)).astype(np.float32))
    else:
        tokens = torch.from_numpy(rng.integers(0, 256, (rows, k)))
    mean = -1.2 if head == "l1" else -5.5
    rollout = torch.from_numpy(rng.normal(mean, 0.3, (rows, k)).astype(np.float32))  # the engine's, not the actor's
    mask = torch.from_numpy(rng.random((rows, k)) < 0.9)
    advantages = torch.from_numpy(rng.choice([-1.0, 1.0], rows).astype(np.float32))
    return MicroBatch(inputs, tokens, rollout, advantages, mask, mask.float() / (2 * mask.numel()),
                      RowIndex.first_steps(rows))


def actor(ds: DeepSpeedConfig | None = None, algo: AlgoConfig = ALGO, head: str = "tokens") -> Actor:
    init_distributed()
    torch.manual_seed(0)
    cfg = replace(CFG, action_head=head)
    return Actor(lambda zero3: build_policy(cfg, TOK, zero3), ds or DeepSpeedConfig(zero_stage=3), algo,
                 scorer=OFTScorer())


def weights(a: Actor) -> str:
    return weights_checksum([(n, t.clone()) for b in gathered_buckets(a.policy, 1) for n, t in b])


def frozen_copy(minis: list[MiniBatch]) -> list[list[list]]:
    return [[[t.clone() if torch.is_tensor(t) else t for t in mb] for mb in mini.micro_batches] for mini in minis]


def same_batches(a: list[list[list]], b: list[list[list]]) -> bool:
    return all(torch.equal(x, y) if torch.is_tensor(x) else x is y
               for ma, mb in zip(a, b, strict=True) for ua, ub in zip(ma, mb, strict=True)
               for x, y in zip(ua, ub, strict=True))


@pytest.mark.parametrize("head", ["tokens", "l1"])
def test_old_logprobs_from_the_update_forward_are_a_recompute_bit_for_bit(head):
    """Old log-probs recomputed for every mini-batch, against the first mini-batch's read off its own forward (the
    other mini-batches' are recomputed before the first optimizer step either way): the same mismatch (so the same
    old log-probs), truncated importance weights, losses, gradient norms and weights after the steps; for either head
    (the l1 head's Gaussian log-probs, its log-std trained with the rest)."""
    minis = [MiniBatch((micro_batch(1, head=head), micro_batch(2, head=head))), MiniBatch((micro_batch(6, head=head),))]
    recomputing = actor(head=head, algo=replace(ALGO, old_logprobs_from_update=False))
    before = recomputing.update(UpdatePlan(tuple(minis)))
    reading = actor(head=head)
    fused = reading.update(UpdatePlan(tuple(minis)))
    assert fused == replace(before, recompute_s=fused.recompute_s)
    assert weights(reading) == weights(recomputing)
    assert before.grad_norm > 0 and before.samples == 12 and before.mismatch.abs_log_ratio > 0
    if head == "l1":
        log_std = dict(reading.policy.named_parameters())["action_noise.log_std"]
        import deepspeed

        with deepspeed.zero.GatheredParameters([log_std]):
            assert not torch.equal(log_std.detach(), torch.full((7,), -1.0))  # the Gaussian's spread trained too


def test_recomputed_old_logprobs_weights_and_mismatch_by_hand():
    """With old_logprobs=recompute the first optimizer step's loss is the clipped loss at ratio 1, each token weighed
    by min(actor / rollout probability, tis_cap) (the actor's log-probs computed here before the update), and the
    mismatch is that of the actor's log-probs against the rollout's over the valid tokens; the batch is unchanged."""
    mb = micro_batch(7)
    a = actor(algo=replace(ALGO, micro_batches=1))
    old = a.logprobs(mb.inputs, mb.tokens)
    weights = mb.weights * truncated_is_weights(old, mb.rollout_logprobs, ALGO.tis_cap)
    loss, _ = clipped_policy_loss(old, old, mb.advantages, mb.mask, ALGO.clip_low, ALGO.clip_high, weights)
    expected = logprob_mismatch(old, mb.rollout_logprobs, mb.mask, ALGO.clip_low, ALGO.clip_high, ALGO.tis_cap)
    minis = [MiniBatch((mb,))]
    kept = frozen_copy(minis)
    result = a.update(UpdatePlan(tuple(minis)))
    assert result.policy_loss == pytest.approx(loss.item(), rel=1e-6)
    assert vars(result.mismatch) == pytest.approx(expected)
    assert same_batches(frozen_copy(minis), kept)


def test_rollout_old_logprobs_take_no_recompute_and_no_importance_weights():
    """With old_logprobs=rollout the ratio's old log-probs are the rollout's, no token is reweighted (tis_cap is for
    recomputed old log-probs), and the mismatch is the first micro-batch's before the first optimizer step."""
    mb = micro_batch(8)
    algo = replace(ALGO, old_logprobs="rollout", micro_batches=1)
    a = actor(algo=algo)
    current = a.logprobs(mb.inputs, mb.tokens)
    loss, info = clipped_policy_loss(current, mb.rollout_logprobs, mb.advantages, mb.mask, algo.clip_low,
                                     algo.clip_high, mb.weights)
    result = a.update(UpdatePlan((MiniBatch((mb,)),)))
    assert result.policy_loss == pytest.approx(loss.item(), rel=1e-6)
    assert result.clip_frac == pytest.approx(info["clip_frac"]) and result.clip_frac > 0
    assert result.mismatch.abs_log_ratio == pytest.approx(info["abs_log_ratio"], rel=1e-6)


def test_trimmed_prompt_padding_trains_alike():
    """Cutting the prompt columns no row uses removes only masked keys: the same positions, logits and update up to
    the order of float sums (bound: 1e-6 relative; measured: the loss equal, the gradient norm 1e-9 apart)."""
    batch = micro_batch(3)
    assert batch.inputs.on("cpu").trimmed().input_ids.shape[1] < batch.inputs.input_ids.shape[1]
    policy = build_policy(CFG, TOK).eval()
    inputs = batch.inputs.on("cpu")
    with torch.no_grad():
        full, cut = policy(inputs), policy(inputs.trimmed())
    assert (full - cut).abs().max() <= 1e-6 * full.abs().max()
    plan = UpdatePlan((MiniBatch((batch,)),))
    untrimmed = actor(DeepSpeedConfig(zero_stage=3, trim_prompt_padding=False)).update(plan)
    trimmed = actor(DeepSpeedConfig(zero_stage=3, trim_prompt_padding=True)).update(plan)
    for key in ("policy_loss", "grad_norm", "entropy", "approx_kl"):
        assert getattr(trimmed, key) == pytest.approx(getattr(untrimmed, key), rel=1e-6, abs=1e-9), key


def test_an_update_accumulates_as_many_micro_batches_as_it_is_given():
    """The accumulation boundary is the update's last micro-batch, whatever `algo.micro_batches` says: one batch of
    eight rows or two of four give the same step (float rounding)."""
    whole = micro_batch(4, rows=8)
    halves = [whole.rows_at(np.arange(start, start + 4)) for start in (0, 4)]
    algo = AlgoConfig(micro_batches=1)
    one, two = actor(algo=algo), actor(algo=algo)
    a = one.update(UpdatePlan((MiniBatch((whole,)),)))
    b = two.update(UpdatePlan((MiniBatch(tuple(halves)),)))
    for key in ("policy_loss", "grad_norm"):
        assert getattr(a, key) == pytest.approx(getattr(b, key), rel=1e-5), key
    second = UpdatePlan((MiniBatch((micro_batch(5, rows=8),)),))
    assert one.update(second).grad_norm == pytest.approx(two.update(second).grad_norm, rel=1e-4)
