"""Bin logits -> action tokens: the one sampler of the rollout engine and of `PretrainedVLA.predict`."""

from __future__ import annotations

import torch
from torch import Tensor


def sample_bins(logits: Tensor, temperature: float, greedy: bool = False,
                generator: torch.Generator | None = None) -> Tensor:
    """Bin logits float32[..., n_bins] -> bin indices int64[...]: the argmax (`greedy`), else one draw per row from
    softmax(logits / temperature) with `torch.multinomial` (`generator`: None draws from torch's global RNG).

    The greedy argmax is taken over the tempered logits too; at temperature 1 they are the logits themselves."""
    tempered = logits / temperature
    if greedy:
        return tempered.argmax(dim=-1)
    probs = torch.softmax(tempered, dim=-1).reshape(-1, logits.shape[-1])
    return torch.multinomial(probs, 1, generator=generator).view(logits.shape[:-1])
