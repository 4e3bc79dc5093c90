"""Spans: tensors lying end to end are read as one view; the engine copies a bucket that lies so in one call."""

import numpy as np
import torch

from vla_scale.config import ModelConfig
from vla_scale.envs.reach import instructions
from vla_scale.models.oft.decode import OFTDecoder
from vla_scale.models.tokenizer import WordTokenizer
from vla_scale.rollout.engine import RolloutEngine
from vla_scale.run_policy import build_policy
from vla_scale.tensors.spans import end_to_end, span

CFG = ModelConfig(image_size=32, patch_size=8, vision_dim=32, hidden_size=32, num_layers=1, num_heads=2,
                  intermediate_size=64, chunk_len=4)


def test_only_tensors_that_lie_end_to_end_make_a_span():
    buffer = torch.arange(10.0)
    a, b, c = buffer[:3], buffer[3:7].view(2, 2), buffer[7:]
    assert end_to_end([a, b, c]) and torch.equal(span([a, b, c]), buffer)
    assert span([a, b, c]).data_ptr() == buffer.data_ptr()
    assert not end_to_end([a, c])  # a gap
    assert not end_to_end([b, a])  # out of order
    assert not end_to_end([a, torch.arange(3.0, 7.0)])  # another storage
    assert not end_to_end([buffer[:4].view(2, 2).t()])  # not contiguous
    assert not end_to_end([buffer[:2], buffer[2:4].view(torch.int32)[:0]]) and span([]) is None
    memory = np.arange(8, dtype=np.float32)
    neighbours = [torch.from_numpy(memory[:4]), torch.from_numpy(memory[4:])]  # side by side, two storages
    assert neighbours[0].data_ptr() + neighbours[0].nbytes == neighbours[1].data_ptr()
    assert not end_to_end(neighbours) and span(neighbours) is None


def test_a_bucket_that_lies_end_to_end_is_copied_whole_and_exactly():
    tok = WordTokenizer.from_instructions(instructions())
    torch.manual_seed(3)
    engine = RolloutEngine(build_policy(CFG, tok), decoder=OFTDecoder())
    torch.manual_seed(4)
    names = [name for name, _ in engine.policy.named_parameters()]
    new = dict(build_policy(CFG, tok).named_parameters())
    flat = torch.cat([new[n].detach().reshape(-1) for n in names])  # a gathered bucket without padding
    views, at = [], 0
    for n in names:
        views.append((n, flat[at : at + new[n].numel()].view(new[n].shape)))
        at += new[n].numel()
    assert end_to_end([t for _, t in views]) and end_to_end([p for p in engine.policy.parameters()][:2])
    engine.update_weights_from_tensor(views, version=1)
    assert all(torch.equal(p, new[n]) for n, p in engine.policy.named_parameters())
    moved = [(n, t + 1) for n, t in reversed(views[:3])]  # not end to end: one copy per tensor
    engine.update_weights_from_tensor(moved, version=2)
    params = dict(engine.policy.named_parameters())
    assert all(torch.equal(params[n], t) for n, t in moved)
    assert all(torch.equal(params[n], new[n]) for n in names[3:])
