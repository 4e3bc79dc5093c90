"""The pure functions RL and fine-tuning optimise (torch only, no state): the clipped policy-gradient loss and its
token weights, group statistics and the dynamic-sampling filter, the supervised losses of fine-tuning on
demonstrations, and the log-likelihood of a flow policy's denoising chain (Flow-SDE's and Flow-Noise's). The
algorithms (`algo/`) and the policies (`models/`) build on them."""

from vla_scale.objectives.groups import group_success_filter
from vla_scale.objectives.policy_loss import (
    LOSS_AGGREGATIONS,
    OLD_LOGPROBS,
    clipped_policy_loss,
    executed_action_mask,
    gaussian_entropy,
    gaussian_logprobs,
    logprob_mismatch,
    logprobs_from_logits,
    loss_normaliser,
    token_entropy,
    token_weights,
    truncated_is_weights,
)
from vla_scale.objectives.supervised import SUPERVISED_HEADS, supervised_loss

__all__ = [
    "LOSS_AGGREGATIONS",
    "OLD_LOGPROBS",
    "SUPERVISED_HEADS",
    "clipped_policy_loss",
    "executed_action_mask",
    "gaussian_entropy",
    "gaussian_logprobs",
    "group_success_filter",
    "logprob_mismatch",
    "logprobs_from_logits",
    "loss_normaliser",
    "supervised_loss",
    "token_entropy",
    "token_weights",
    "truncated_is_weights",
]
