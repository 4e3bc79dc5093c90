import math

import pytest
import torch

from vla_scale.objectives import supervised_loss


def test_token_cross_entropy_is_the_mean_negative_log_softmax_of_the_label_bins():
    logits = torch.tensor([[[2.0, 0.0, 0.0], [0.0, 1.0, 0.0]]])
    labels = torch.tensor([[0, 2]])
    loss, info = supervised_loss(logits, labels, "tokens")
    by_hand = -(math.log(math.exp(2) / (math.exp(2) + 2)) + math.log(1 / (math.e + 2))) / 2
    assert loss.item() == pytest.approx(by_hand, rel=1e-6)
    assert info["token_accuracy"] == 0.5


def test_l1_loss_reads_the_mean_and_leaves_the_log_std_without_gradient():
    params = torch.tensor([[[0.5, -1.0], [-0.25, -1.0]]], requires_grad=True)
    loss, info = supervised_loss(params, torch.tensor([[0.0, 0.25]]), "l1")
    assert loss.item() == pytest.approx(0.5) and info["l1"] == pytest.approx(0.5)
    loss.backward()
    assert params.grad is not None and torch.equal(params.grad[..., 1], torch.zeros(1, 2))


def test_wrong_shapes_and_heads_are_refused():
    with pytest.raises(ValueError, match="labels"):
        supervised_loss(torch.zeros(1, 2, 3), torch.zeros(1, 3, dtype=torch.long), "tokens")
    with pytest.raises(ValueError, match="no supervised loss"):
        supervised_loss(torch.zeros(1, 2, 2), torch.zeros(1, 2), "diffusion")
