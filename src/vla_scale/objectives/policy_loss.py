"""The clipped policy-gradient objective every RL algorithm here trains with: which tokens count (executed actions),
how they weigh (token or trajectory mean), truncated importance weights, the rollout <-> actor mismatch, the clipped
loss, and the log-probs and entropies of OFT's heads.

Every function is pure (no state, no I/O) and imports only torch, so the math can be checked by hand in unit tests.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from vla_scale.objectives.groups import group_index, group_sums

LOSS_AGGREGATIONS = ("token_mean", "trajectory_mean")
"""How a mini-batch's token objectives are averaged into its loss (`token_weights`)."""


def executed_action_mask(executed: Tensor, chunk_len: int, action_dim: int) -> Tensor:
    """Tokens of the actions a chunk step really ran; bool [M, chunk_len * action_dim] for `executed` [M].

    A chunk's token 7i + j belongs to its action i (OFT's order: step-major), so it counts when i < executed. An
    episode stops inside a chunk at its first success or at the step limit: the actions after that never reached the
    env, so their tokens carry no credit for the reward and stay out of the loss.
    """
    if executed.dim() != 1:
        raise ValueError(f"executed must be [M], got shape {tuple(executed.shape)}")
    if bool(((executed < 0) | (executed > chunk_len)).any()):
        raise ValueError(f"executed actions must lie in [0, {chunk_len}], got {executed.tolist()}")
    action = torch.arange(chunk_len * action_dim, device=executed.device) // action_dim
    return action.unsqueeze(0) < executed.long().unsqueeze(1)


def loss_normaliser(mask: Tensor, trajectory: Tensor, aggregation: str) -> float:
    """What `token_weights` divides by: the valid tokens of the mini-batch (token_mean) or its episodes with a valid
    token (trajectory_mean). Summed over the ranks, it makes several ranks weigh episodes as one rank would."""
    _check_weights_args(mask, trajectory, aggregation)
    if aggregation == "token_mean":
        return float(mask.bool().sum())
    index, n = group_index(trajectory, trajectory.shape[0], mask.device)
    return float((group_sums(mask.bool().to(torch.float64).sum(dim=1), index, n) > 0).sum())


def token_weights(mask: Tensor, trajectory: Tensor, aggregation: str, normaliser: float | None = None) -> Tensor:
    """Per-token weights float64 [M, L] of one mini-batch's loss, summing to 1 over its valid tokens.

    `mask` bool [M, L]: valid tokens of each row (a chunk step); `trajectory` [M]: which episode each row belongs to.
    - "token_mean": every valid token of the mini-batch weighs the same, 1 / |valid|. Long episodes (failures run to
      the step limit) then weigh more than short ones.
    - "trajectory_mean": the mean over the mini-batch's episodes of each episode's token mean (SimpleVLA-RL's and
      RLinf's aggregation): a token of episode e weighs 1 / (E * |valid_e|), whatever the episode's length. The
      mini-batch must hold whole episodes for this to mean what it says.
    The weights do not depend on how the mini-batch is split into micro-batches: each micro-batch's loss is the sum
    of its tokens' weighted objectives, and the mini-batch's loss is the sum of those. `normaliser` replaces |valid|
    or E (`loss_normaliser`): with several ranks, the sum over ranks divided by their number, so that the mean of the
    ranks' gradients (DeepSpeed's) is the gradient one rank holding every episode would compute.
    """
    _check_weights_args(mask, trajectory, aggregation)
    valid = mask.bool().to(torch.float64)
    total = loss_normaliser(mask, trajectory, aggregation) if normaliser is None else normaliser
    total = total if total > 0 else 1.0  # nothing valid: every weight is 0 anyway
    if aggregation == "token_mean":
        return valid / total
    index, n = group_index(trajectory, trajectory.shape[0], mask.device)
    per_episode = group_sums(valid.sum(dim=1), index, n)
    return valid / (per_episode[index].clamp(min=1) * total).unsqueeze(1)


def _check_weights_args(mask: Tensor, trajectory: Tensor, aggregation: str) -> None:
    if aggregation not in LOSS_AGGREGATIONS:
        raise ValueError(f"unknown loss aggregation {aggregation!r}; choose one of {LOSS_AGGREGATIONS}")
    if mask.dim() != 2 or trajectory.shape != mask.shape[:1]:
        raise ValueError(f"need mask [M, L] and trajectory [M], got {tuple(mask.shape)} and {tuple(trajectory.shape)}")


OLD_LOGPROBS = ("rollout", "recompute")
"""Where the PPO ratio's old log-probs come from: the rollout engine's, or the actor's own before the update."""


def truncated_is_weights(actor_logprobs: Tensor, rollout_logprobs: Tensor, cap: float) -> Tensor:
    """min(pi_actor / pi_rollout, cap) per token: the truncated importance weight that corrects a loss computed on
    tokens the rollout engine sampled for the actor's own distribution (the two differ by kernels and precision)."""
    if cap <= 0:
        raise ValueError(f"cap must be > 0, got {cap}")
    return torch.exp(actor_logprobs.float() - rollout_logprobs.float()).clamp(max=cap)


@torch.no_grad()
def logprob_mismatch(actor_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor, clip_low: float = 0.2,
                     clip_high: float = 0.28, tis_cap: float = 0.0) -> dict[str, float]:
    """How far the rollout engine's log-probs are from the actor's on the same tokens (valid ones): mean |delta|,
    the k3 estimate of KL(rollout || actor) (ratio - 1 - log ratio with ratio = pi_actor / pi_rollout), the share of
    ratios outside [1 - clip_low, 1 + clip_high], i.e. where clipping would act on mismatch alone, and the spread of
    the ratios, which are the behaviour weights before truncation: their standard deviation, their largest value and
    the share above `tis_cap` (0 when there is no cap)."""
    valid = mask.bool()
    if not bool(valid.any()):
        return {"abs_log_ratio": 0.0, "approx_kl": 0.0, "outside_clip": 0.0, "weight_std": 0.0, "weight_max": 0.0,
                "truncated": 0.0}
    log_ratio = (actor_logprobs.float() - rollout_logprobs.float())[valid]
    ratio = log_ratio.exp()
    return {"abs_log_ratio": float(log_ratio.abs().mean()), "approx_kl": float((ratio - 1 - log_ratio).mean()),
            "outside_clip": float(((ratio < 1 - clip_low) | (ratio > 1 + clip_high)).float().mean()),
            "weight_std": float(ratio.std(correction=0)), "weight_max": float(ratio.max()),
            "truncated": float((ratio > tis_cap).float().mean()) if tis_cap > 0 else 0.0}


def _check_loss_shapes(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor) -> None:
    if logprobs.dim() != 2 or old_logprobs.shape != logprobs.shape:
        raise ValueError(
            f"logprobs {tuple(logprobs.shape)} and old_logprobs {tuple(old_logprobs.shape)} must be [M, L]"
        )
    if advantages.shape != logprobs.shape[:1]:
        raise ValueError(f"advantages must be [M]={tuple(logprobs.shape[:1])}, got {tuple(advantages.shape)}")
    if mask.shape not in (logprobs.shape, logprobs.shape[:1]):
        raise ValueError(f"mask must be [M, L] or [M], got {tuple(mask.shape)} for logprobs {tuple(logprobs.shape)}")


def clipped_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Token-level PPO clipped surrogate with clip-higher; returns (scalar loss, metrics).

    ratio_t = exp(logprob_t - old_logprob_t), A_t = advantage of the token's row (sequence / chunk step),
        loss = -(1/|V|) Σ_{t∈V} min(ratio_t·A_t, clip(ratio_t, 1 - clip_low, 1 + clip_high)·A_t),
    where V is the set of valid (mask=True) tokens of the WHOLE batch: token-mean aggregation, so every valid token
    weighs the same whatever the length of its row. The upper clip is wider than the lower one ("clip-higher", DAPO)
    so that low-probability tokens with positive advantage can still gain probability, which keeps entropy up.

    ``weights`` [M, L] replace the token mean by Σ_t w_t·objective_t (from `token_weights`, which spreads a whole
    mini-batch's weights over its micro-batches). ``mask`` is [M, L] or [M] (one flag per row). Masked tokens get
    log-ratio 0 before the exp, so inf / NaN there cannot leak into the loss or its gradient. With no valid token the
    loss is a sum of masked zeros: finite, 0, and still connected to ``logprobs`` (zero gradient), so backward() runs
    on every rank.

    Metrics (floats, over valid tokens; 0 when there are none): ``clip_frac`` = fraction where the clipped branch is
    strictly smaller (so it is the one taken and the token gets no gradient); ``approx_kl`` = k3 estimator
    mean(ratio - 1 - log ratio) of KL(old ‖ new), non-negative and unbiased under samples from the old policy;
    ``ratio_mean``; ``abs_log_ratio`` = mean |log ratio|; ``outside_clip`` = share of ratios outside [1 - clip_low,
    1 + clip_high]; ``n_tokens``. Before any optimizer step the last three measure the rollout <-> actor mismatch.
    """
    _check_loss_shapes(logprobs, old_logprobs, advantages, mask)
    if not (0.0 <= clip_low < 1.0 and clip_high >= 0.0):
        raise ValueError(f"need 0 <= clip_low < 1 and clip_high >= 0, got {clip_low}, {clip_high}")
    valid = (mask.bool() if mask.dim() == 2 else mask.bool().unsqueeze(1)).expand_as(logprobs)
    log_ratio = logprobs.float() - old_logprobs.detach().float()
    log_ratio = torch.where(valid, log_ratio, torch.zeros_like(log_ratio))
    ratio = torch.exp(log_ratio)
    adv = advantages.detach().float().unsqueeze(1)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    objective = torch.where(valid, torch.minimum(unclipped, clipped), torch.zeros_like(unclipped))
    n_valid = int(valid.sum())
    if weights is None:
        loss = -objective.sum() / max(n_valid, 1)
    else:
        if weights.shape != logprobs.shape:
            raise ValueError(f"weights must be {tuple(logprobs.shape)}, got {tuple(weights.shape)}")
        loss = -(objective * torch.where(valid, weights.detach().to(objective.dtype), 0.0)).sum()
    outside = (ratio < 1.0 - clip_low) | (ratio > 1.0 + clip_high)
    return loss, _loss_metrics(ratio, log_ratio, clipped < unclipped, outside, valid, n_valid)


@torch.no_grad()
def _loss_metrics(
    ratio: Tensor, log_ratio: Tensor, clip_taken: Tensor, outside: Tensor, valid: Tensor, n_valid: int
) -> dict[str, float]:
    """Means over valid tokens of the clip indicator, the k3 KL estimate, the ratio, |log ratio| and the share of
    ratios outside the clip range."""
    if n_valid == 0:
        return {"clip_frac": 0.0, "approx_kl": 0.0, "ratio_mean": 0.0, "abs_log_ratio": 0.0, "outside_clip": 0.0,
                "n_tokens": 0.0}
    k3 = ratio - 1.0 - log_ratio
    return {
        "clip_frac": float((clip_taken & valid).sum()) / n_valid,
        "approx_kl": float(k3[valid].mean()),
        "ratio_mean": float(ratio[valid].mean()),
        "abs_log_ratio": float(log_ratio.abs()[valid].mean()),
        "outside_clip": float((outside & valid).sum()) / n_valid,
        "n_tokens": float(n_valid),
    }


def logprobs_from_logits(logits: Tensor, tokens: Tensor, temperature: float = 1.0) -> Tensor:
    """log softmax(logits / temperature)[token] per position; float32 [...] for logits [..., V], tokens [...] long.

    Computed as z[token] - logsumexp(z) with z = logits / temperature - max(logits / temperature) in float32: after
    the shift both terms are small numbers, so large logits neither overflow nor lose float32 resolution (a logsumexp
    near 1e4 is only good to ~1e-3). Rollout and training must pass the same temperature (the sampling one) for the
    importance ratio to be meaningful.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if tokens.shape != logits.shape[:-1]:
        raise ValueError(f"tokens shape {tuple(tokens.shape)} must equal logits.shape[:-1]={tuple(logits.shape[:-1])}")
    z = logits.float() / temperature
    shift = z.detach().amax(dim=-1, keepdim=True)
    z = z - torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))
    picked = torch.gather(z, -1, tokens.long().unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(z, dim=-1)


def token_entropy(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """H = -Σ_v p_v log p_v with p = softmax(logits / temperature), per position; float32 [...] for logits [..., V].

    Terms with p_v = 0 (logit -inf) count as 0 (the limit of p log p), and their gradient is 0 rather than NaN.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    p = logp.exp()
    safe_logp = torch.where(p > 0, logp, torch.zeros_like(logp))
    return -(p * safe_logp).sum(dim=-1)


_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def gaussian_logprobs(mean: Tensor, log_std: Tensor, samples: Tensor) -> Tensor:
    """log N(x; mean, exp(log_std)^2) per dimension, float32 [...]: -((x - mean) / std)^2 / 2 - log_std - log(2 pi) / 2.

    The L1 head's Gaussian policy: `mean` [..., K] from the head, `log_std` [..., K] (state-independent, broadcast),
    `samples` [..., K] the drawn normalised actions (before any clipping for the env, so the density is of what was
    drawn)."""
    if samples.shape != mean.shape:
        raise ValueError(f"samples shape {tuple(samples.shape)} must equal mean's {tuple(mean.shape)}")
    log_std = log_std.float()
    z = (samples.float() - mean.float()) * torch.exp(-log_std)
    return -0.5 * z.square() - log_std - _HALF_LOG_2PI


def gaussian_entropy(log_std: Tensor) -> Tensor:
    """Differential entropy of each dimension's Gaussian, float32: log_std + log(2 pi e) / 2."""
    return log_std.float() + _HALF_LOG_2PI + 0.5
