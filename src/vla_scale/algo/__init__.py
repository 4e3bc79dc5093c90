"""GRPO (group advantages, dynamic-sampling filter, loss masks and weights, clipped policy loss, log-prob helpers),
PPO's critic math (chunk-level GAE, advantage normalisation, clipped value loss) and the supervised losses of
fine-tuning on demonstrations."""

from vla_scale.algo.grpo import (
    LOSS_AGGREGATIONS,
    OLD_LOGPROBS,
    clipped_policy_loss,
    executed_action_mask,
    gaussian_entropy,
    gaussian_logprobs,
    group_advantages,
    group_success_filter,
    logprob_mismatch,
    logprobs_from_logits,
    loss_normaliser,
    token_entropy,
    token_weights,
    truncated_is_weights,
)
from vla_scale.algo.ppo import chunk_gae, clipped_value_loss, explained_variance, normalized
from vla_scale.algo.supervised import SUPERVISED_HEADS, supervised_loss

__all__ = [
    "SUPERVISED_HEADS",
    "supervised_loss",
    "LOSS_AGGREGATIONS",
    "OLD_LOGPROBS",
    "chunk_gae",
    "clipped_policy_loss",
    "clipped_value_loss",
    "explained_variance",
    "normalized",
    "executed_action_mask",
    "gaussian_entropy",
    "gaussian_logprobs",
    "group_advantages",
    "group_success_filter",
    "logprob_mismatch",
    "logprobs_from_logits",
    "token_entropy",
    "loss_normaliser",
    "token_weights",
    "truncated_is_weights",
]
