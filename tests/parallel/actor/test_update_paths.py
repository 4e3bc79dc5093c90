"""The update's faster paths compute the update they replace (tiny model, ZeRO-3 on CPU, fp32): old log-probs read off
the update's own forward instead of a recompute pass, prompt padding trimmed per micro-batch, micro-batches counted
by the update rather than by the config."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from vla_scale.algo import truncated_is_weights
from vla_scale.batches import MicroBatch
from vla_scale.config import AlgoConfig, DeepSpeedConfig, ModelConfig
from vla_scale.envs.reach import instructions
from vla_scale.models import Processor, WordTokenizer, build_policy
from vla_scale.models.spec import spec_from_model_config
from vla_scale.parallel.actor import Actor
from vla_scale.parallel.sync.weight_sync import gathered_buckets
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
    inputs = Processor.for_spec(SPEC, TOK, max_text_len=40).from_arrays(images, texts(rows), proprio)  # suite budget
    k = CFG.chunk_len * 7
    if head == "l1":  # the Gaussian's draws: normalised action values
        tokens = torch.from_numpy(rng.normal(0, 1, (rows, k)).astype(np.float32))
    else:
        tokens = torch.from_numpy(rng.integers(0, 256, (rows, k)))
    mean = -1.2 if head == "l1" else -5.5
    rollout = torch.from_numpy(rng.normal(mean, 0.3, (rows, k)).astype(np.float32))  # the engine's, not the actor's
    mask = torch.from_numpy(rng.random((rows, k)) < 0.9)
    advantages = torch.from_numpy(rng.choice([-1.0, 1.0], rows).astype(np.float32))
    return MicroBatch(inputs, tokens, rollout, advantages, mask, mask.float() / (2 * mask.numel()))


def actor(ds: DeepSpeedConfig | None = None, algo: AlgoConfig = ALGO, head: str = "tokens") -> Actor:
    init_distributed()
    torch.manual_seed(0)
    cfg = replace(CFG, action_head=head)
    return Actor(lambda zero3: build_policy(cfg, TOK, zero3), ds or DeepSpeedConfig(zero_stage=3), algo)


def weights(a: Actor) -> str:
    return weights_checksum([(n, t.clone()) for b in gathered_buckets(a.policy, 1) for n, t in b])


@pytest.mark.parametrize("head", ["tokens", "l1"])
def test_old_logprobs_from_the_update_forward_are_a_recompute_bit_for_bit(head):
    """A recompute pass then the update, against the update alone taking its forward's log-probs as the old ones:
    the same old log-probs, truncated importance weights, loss, gradient norm and weights after the step; for either
    head (the l1 head's Gaussian log-probs, its log-std trained with the rest)."""
    batches = [micro_batch(1, head=head), micro_batch(2, head=head)]
    recomputing = actor(head=head)
    recomputed = [recomputing.logprobs(mb.inputs, mb.tokens) for mb in batches]
    plain = [mb._replace(old_logprobs=old, weights=mb.weights * truncated_is_weights(old, mb.old_logprobs, 1.5))
             for mb, old in zip(batches, recomputed, strict=True)]
    before = recomputing.update(plain)
    reading = actor(head=head)
    fused = reading.update(batches, old_from_forward=True)
    assert all(torch.equal(a, b) for a, b in zip(fused.forward_logprobs, recomputed, strict=True))
    assert fused.metrics == {k: v for k, v in before.metrics.items() if not k.startswith("mismatch_")}
    assert weights(reading) == weights(recomputing)
    assert before.metrics["clip_frac"] == 0.0 and before.metrics["grad_norm"] > 0  # the ratio is 1 at the first step
    if head == "l1":
        log_std = dict(reading.policy.named_parameters())["action_noise.log_std"]
        import deepspeed

        with deepspeed.zero.GatheredParameters([log_std]):
            assert not torch.equal(log_std.detach(), torch.full((7,), -1.0))  # the Gaussian's spread trained too
        assert before.metrics["entropy"] == pytest.approx(-1.0 + 0.5 * np.log(2 * np.pi * np.e))


def test_trimmed_prompt_padding_trains_alike():
    """Cutting the prompt columns no row uses removes only masked keys: the same positions, logits and update up to
    the order of float sums (bound: 1e-6 relative; measured: the loss equal, the gradient norm 1e-9 apart)."""
    batch = micro_batch(3)
    assert batch.inputs.trimmed().input_ids.shape[1] < batch.inputs.input_ids.shape[1]
    policy = build_policy(CFG, TOK).eval()
    with torch.no_grad():
        full, cut = policy(batch.inputs), policy(batch.inputs.trimmed())
    assert (full - cut).abs().max() <= 1e-6 * full.abs().max()
    untrimmed = actor(DeepSpeedConfig(zero_stage=3, trim_prompt_padding=False)).update([batch]).metrics
    trimmed = actor(DeepSpeedConfig(zero_stage=3, trim_prompt_padding=True)).update([batch]).metrics
    for key in ("policy_loss", "grad_norm", "entropy", "approx_kl"):
        assert trimmed[key] == pytest.approx(untrimmed[key], rel=1e-6, abs=1e-9), key


def test_an_update_accumulates_as_many_micro_batches_as_it_is_given():
    """The accumulation boundary is the update's last micro-batch, whatever `algo.micro_batches` says: one batch of
    eight rows or two of four give the same step (float rounding)."""
    whole = micro_batch(4, rows=8)
    halves = [MicroBatch(*(t[rows] if torch.is_tensor(t) else t for t in whole)) for rows in (slice(0, 4), slice(4, 8))]
    halves = [h._replace(inputs=type(whole.inputs)(*(t[rows] for t in vars(whole.inputs).values())))
              for h, rows in zip(halves, (slice(0, 4), slice(4, 8)), strict=True)]
    algo = AlgoConfig(micro_batches=1)
    one, two = actor(algo=algo), actor(algo=algo)
    a, b = one.update([whole]).metrics, two.update(halves).metrics
    for key in ("policy_loss", "grad_norm"):
        assert a[key] == pytest.approx(b[key], rel=1e-5), key
    second = [micro_batch(5, rows=8)]
    assert one.update(second).metrics["grad_norm"] == pytest.approx(two.update(second).metrics["grad_norm"], rel=1e-4)
