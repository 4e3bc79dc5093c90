"""The shared flow machinery by hand: the two roundings of the Euler times, the prefix-LM mask, the time embedding's
periods, and what a family must implement."""

from __future__ import annotations

import math

import pytest
import torch

from vla_scale.models.flow.policy import (
    FlowInputs,
    FlowPolicy,
    attention_allowed,
    rounded_euler_times,
    time_embedding,
)
from vla_scale.objectives.flow_sde import euler_times


@pytest.mark.parametrize("steps", [1, 3, 10, 13])
def test_rounded_times_are_one_plus_k_dt_rounded_once(steps: int):
    times, dt = rounded_euler_times(steps)
    assert times.tolist() == [float(torch.tensor(1.0 + k * (-1.0 / steps), dtype=torch.float32))
                              for k in range(steps)]
    accumulated, same_dt = euler_times(steps)
    assert torch.equal(dt, same_dt) and (times - accumulated).abs().max() < 1e-6


def test_the_prefix_lm_rule():
    pad = torch.tensor([[True, True, False, True, True]])
    blocks = torch.tensor([[0, 0, 0, 1, 1]])
    allowed = attention_allowed(pad, blocks)[0]
    assert allowed[0].tolist() == [True, True, False, False, False]  # the first block never sees later ones
    assert allowed[3].tolist() == [True, True, False, True, False]  # causal between single-token blocks
    assert not allowed[2].any()  # a pad sees nothing and is seen by nothing


def test_the_time_embedding_spans_its_periods():
    emb = time_embedding(torch.tensor([0.5], dtype=torch.float64), 8, periods=(1.0, 8.0))
    angles = [0.5 * 2 * math.pi / p for p in (1.0, 2.0, 4.0, 8.0)]
    assert torch.allclose(emb[0], torch.tensor([*map(math.sin, angles), *map(math.cos, angles)],
                                               dtype=torch.float64))


def test_a_family_that_implements_nothing_is_told_so():
    policy = FlowPolicy()
    inputs = FlowInputs(*(torch.zeros(1) for _ in range(5)))
    with pytest.raises(NotImplementedError):
        policy.prefix_pass(inputs)
    with pytest.raises(NotImplementedError):
        policy.velocity_joint(inputs, torch.zeros(1), torch.zeros(1))
