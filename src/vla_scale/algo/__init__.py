"""GRPO: group advantages, dynamic-sampling filter, valid-step mask, clipped policy loss, log-prob helpers."""

from vla_scale.algo.grpo import (
    GroupStats,
    clipped_policy_loss,
    group_advantages,
    group_success_filter,
    logprobs_from_logits,
    summarize_groups,
    token_entropy,
    valid_step_mask,
)

__all__ = [
    "GroupStats",
    "clipped_policy_loss",
    "group_advantages",
    "group_success_filter",
    "logprobs_from_logits",
    "summarize_groups",
    "token_entropy",
    "valid_step_mask",
]
