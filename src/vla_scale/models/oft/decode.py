"""OFT's two sides of a sampled chunk: the rollout engine's decode (`OFTDecoder`: the action head's distribution over
the engine's logits, one sample per action dimension) and the actor's score of the same tokens again (`OFTScorer`:
the head's distribution over the update forward's logits). Both take log-probs with the head's `distribution` at the
sampling temperature, so the rollout and the actor agree bit for bit where they run the same arithmetic.

The engine's logits come from the policy's own forward, or from `FastForward` (`models/oft/fast_forward.py`: trimmed
prompts, packed rows, compiled blocks, FP8 products), which `OFTDecoder.fast_forward` builds for the engine when the
policy supports it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from vla_scale.models.interface import DecodingEngine, Sampled
from vla_scale.models.oft.fast_forward import FastForward
from vla_scale.models.oft.fp8 import Fp8Weights


class OFTDecoder:
    """How the rollout engine decodes an OFT policy (`ChunkDecoder`)."""

    @staticmethod
    def fp8_weights(emulate: bool) -> Fp8Weights:
        return Fp8Weights(emulate)

    @staticmethod
    def fast_forward(policy: nn.Module, compile: bool, fp8: Fp8Weights | None) -> FastForward | None:
        """The engine's fast forward of `policy` (None: the policy has a MLP it does not run)."""
        return FastForward(policy, compile, fp8=fp8) if FastForward.supports(policy) else None

    @staticmethod
    def decode(engine: DecodingEngine, batch: Any, temperature: float, greedy: bool
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, Sampled]:
        """(tokens [B, chunk*action_dim], their log-probs float32, actions float64 [B, chunk, action_dim], nothing
        more sampled): every action dimension sampled (or its mode, `greedy`) from one forward's logits."""
        on_host = batch.attention_mask.device.type == "cpu"
        lengths = batch.attention_mask.sum(dim=1).tolist() if on_host else None
        raw = engine.logits(engine.inputs(batch), lengths)  # lengths from the host: no wait for the device copies
        dist = engine.policy.distribution
        tokens = dist.sample(raw, temperature, greedy, engine.generator)
        # the same function the actor scores them with (`OFTScorer`), so both agree bitwise
        logprobs = dist.logprobs(raw, tokens, temperature)
        tokens_np = tokens.cpu().numpy()
        return tokens_np, logprobs.cpu().numpy(), engine.policy.tokens_to_actions(tokens_np, greedy=greedy), {}


class OFTScorer:
    """How the actor scores an OFT policy's recorded tokens again (`ChunkScorer`): the head's distribution over the
    update forward's output, at the sampling temperature."""

    @staticmethod
    def logprobs(forward: Callable[..., Any], policy: nn.Module, inputs: Any, tokens: Tensor,
                 sampled: dict[str, Tensor], device: torch.device, temperature: float, trim: bool, **critic: bool
                 ) -> tuple[Tensor, Callable[[], Tensor], Tensor | None]:
        del sampled  # the tokens say it all
        out = forward(inputs, device=device, trim=trim, **critic)
        params, values = out if critic else (out, None)  # the head's distribution parameters (and the values)
        dist = policy.distribution
        logprobs = dist.logprobs(params, tokens.to(device), temperature)
        return logprobs, lambda: dist.entropy(params.detach(), temperature), values
