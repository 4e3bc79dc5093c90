"""Weight fingerprints: every single changed byte shows, batching changes nothing, layout does not matter."""

import pytest
import torch

from vla_scale.tensors.checksum import fingerprints, weights_checksum

SHAPES = [(1, torch.float32), (3, torch.bfloat16), (2048, torch.bfloat16), (4099, torch.float32),
          (3 * 1024 + 5, torch.int8), (70000, torch.bfloat16), (0, torch.float32)]


def tensor_fingerprint(tensor: torch.Tensor) -> torch.Tensor:
    """One tensor's fingerprint, int64[4], from a batch of one."""
    return fingerprints([tensor])[0]


def _tensors() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(-100, 100, (n,), generator=gen).to(dtype) if dtype == torch.int8
            else torch.randn(n, generator=gen).to(dtype) for n, dtype in SHAPES]


def test_a_batch_fingerprints_each_tensor_as_alone():
    tensors = _tensors()
    batch = fingerprints(tensors)
    assert batch.shape == (len(tensors), 4)
    for i, t in enumerate(tensors):
        assert torch.equal(batch[i], tensor_fingerprint(t))


def test_tensors_of_one_length_reduced_together_keep_their_own_fingerprints(monkeypatch):
    import vla_scale.tensors.checksum as checksum

    monkeypatch.setattr(checksum, "_STACK_BYTES", 3 * 4096)  # stacks of three 1-row bodies: several stacks per length
    gen = torch.Generator().manual_seed(1)
    tensors = [torch.randn(n, generator=gen).to(torch.bfloat16) for n in [2048, 7, 2048 + 3, 2048, 7, 2048, 2048,
                                                                          2048 + 3, 2048]]
    batch = fingerprints(tensors)
    for i, t in enumerate(tensors):
        assert torch.equal(batch[i], tensor_fingerprint(t)), i
    assert len({tuple(row) for row in batch.tolist()}) == len(tensors)  # equal lengths, different bytes
    # the same tensors laid end to end in one buffer (as the rollout engine holds its weights): reduced as they lie
    buffer = torch.cat([t.reshape(-1) for t in tensors])
    views, at = [], 0
    for t in tensors:
        views.append(buffer[at : at + t.numel()])
        at += t.numel()
    assert torch.equal(fingerprints(views), batch)
    runs = list(checksum._bodies([v.view(torch.uint8) for v in views], [0, 3, 5, 6, 8], 4096))
    assert [part for part, _ in runs] == [[5, 6], [0, 3, 8]]  # 5 and 6 adjacent: a view of the buffer; others stacked
    assert runs[0][1].data_ptr() == views[5].data_ptr()


@pytest.mark.parametrize("index", range(len(SHAPES) - 1))
def test_every_single_changed_byte_changes_the_fingerprint(index):
    t = _tensors()[index]
    data = t.reshape(-1).view(torch.uint8)
    base = tensor_fingerprint(t)
    n = data.numel()
    edges = {p for row in range(0, n + 1, 4096) for p in range(row - 8, row + 8)}  # around row boundaries
    positions = sorted({p for p in edges | set(range(0, n, max(1, n // 1500))) | set(range(n - 64, n)) if 0 <= p < n})
    for pos in positions:  # row bodies, row boundaries and tails alike
        changed = data.clone()
        changed[pos] ^= 1 << (pos % 8)
        assert not torch.equal(tensor_fingerprint(changed.view(t.dtype)), base), pos


def test_swapped_words_change_the_fingerprint():
    t = torch.randn(8192, generator=torch.Generator().manual_seed(1))
    for i, j in [(5, 9), (5, 5 + 1024), (0, 8191)]:  # same row, same column, far apart
        swapped = t.clone()
        swapped[i], swapped[j] = t[j], t[i]
        assert not torch.equal(tensor_fingerprint(swapped), tensor_fingerprint(t))


def test_the_fingerprint_reads_bytes_not_storage_layout():
    base = torch.randn(1001, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    view = base[1:]  # storage offset of 2 bytes: not aligned for int32 words
    assert torch.equal(tensor_fingerprint(view), tensor_fingerprint(view.clone()))
    matrix = torch.randn(64, 96, generator=torch.Generator().manual_seed(3))
    assert torch.equal(tensor_fingerprint(matrix.t()), tensor_fingerprint(matrix.t().contiguous()))


def test_the_checksum_covers_names_shapes_and_dtypes():
    t = torch.zeros(8)
    assert weights_checksum([("a", t)]) == weights_checksum([("a", t.clone())])
    assert weights_checksum([("a", t)]) != weights_checksum([("b", t)])
    assert weights_checksum([("a", t)]) != weights_checksum([("a", t.view(2, 4))])
    assert weights_checksum([("a", t)]) != weights_checksum([("a", t.view(torch.int32))])
    assert weights_checksum([("a", t), ("b", t + 1)]) == weights_checksum([("b", t + 1), ("a", t)])
