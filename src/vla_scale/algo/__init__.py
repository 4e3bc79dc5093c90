"""The RL algorithms, one module each (docs/CONFIG.md lists them), behind one class (`base.Algorithm`) and found by name
(`registry.make_algorithm`): the advantages an update trains on and what each adds to the clipped policy loss. The
objectives they share are `vla_scale.objectives`' (re-exported here)."""

from vla_scale.objectives import (
    clipped_policy_loss,
    logprob_mismatch,
    logprobs_from_logits,
    token_weights,
    truncated_is_weights,
)

__all__ = ["clipped_policy_loss", "logprob_mismatch", "logprobs_from_logits", "token_weights", "truncated_is_weights"]
