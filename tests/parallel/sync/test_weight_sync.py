"""Weight sync from a real DeepSpeed ZeRO-3 actor into the rollout engine, proven by checksums."""

from itertools import pairwise

import pytest
import torch

from vla_scale.config import AlgoConfig, DeepSpeedConfig, ModelConfig
from vla_scale.envs.reach import instructions
from vla_scale.models.oft.decode import OFTDecoder, OFTScorer
from vla_scale.models.tokenizer import WordTokenizer
from vla_scale.parallel.actor import Actor
from vla_scale.parallel.sync.weight_sync import _end_to_end, gathered_buckets, sync_weights
from vla_scale.rollout.engine import RolloutEngine
from vla_scale.run_policy import build_policy
from vla_scale.run_setup import init_distributed
from vla_scale.tensors.checksum import weights_checksum

CFG = ModelConfig(image_size=32, patch_size=8, vision_dim=32, hidden_size=32, num_layers=1, num_heads=2,
                  intermediate_size=64, chunk_len=4)


@pytest.fixture(scope="module")
def actor_and_engine():
    init_distributed()
    tok = WordTokenizer.from_instructions(instructions())
    torch.manual_seed(0)
    actor = Actor(lambda zero3: build_policy(CFG, tok, zero3), DeepSpeedConfig(zero_stage=3),
                  AlgoConfig(micro_batches=1), scorer=OFTScorer())
    return actor, RolloutEngine(build_policy(CFG, tok), decoder=OFTDecoder())


def test_zero3_shards_are_empty_outside_a_gather(actor_and_engine):
    actor, _ = actor_and_engine
    assert all(p.numel() == 0 for p in actor.policy.parameters())


def test_sync_copies_exact_weights_and_checksums_agree(actor_and_engine):
    actor, engine = actor_and_engine
    report = sync_weights(actor.policy, engine, version=3, bucket_mb=0.01)
    assert engine.version == 3 and report.buckets > 1 and report.checksum
    full = [(n, t.clone()) for bucket in gathered_buckets(actor.policy, 1) for n, t in bucket]
    assert weights_checksum(full) == engine.checksum()


def test_buckets_respect_the_size_limit_and_keep_modules_whole(actor_and_engine):
    """A bucket passes the limit only by its last module's further parameters (a module's parameters share a bucket:
    a LoRA layer's weight and adapters are merged together)."""
    actor, _ = actor_and_engine
    limit_mb = 0.02
    seen: list[str] = []
    for bucket in gathered_buckets(actor.policy, limit_mb):
        sizes = [t.numel() * t.element_size() for _, t in bucket]
        modules = [name.rsplit(".", 1)[0] for name, _ in bucket]
        carried = sum(size for i, size in enumerate(sizes) if i and modules[i] == modules[-1] == modules[i - 1])
        assert len(set(modules)) == 1 or sum(sizes) - carried <= limit_mb * 2**20
        assert modules[0] not in seen  # no module continues from the bucket before
        seen += modules


def test_checksum_detects_any_difference(actor_and_engine):
    actor, engine = actor_and_engine
    sync_weights(actor.policy, engine, version=4, bucket_mb=1)
    before = engine.checksum()
    with torch.no_grad():
        p = next(engine.policy.parameters())
        p.view(-1)[0] += 1e-7
    assert engine.checksum() != before


def test_sync_raises_when_the_engine_cannot_hold_the_actor_weights(actor_and_engine):
    actor, _ = actor_and_engine
    tok = WordTokenizer.from_instructions(instructions())
    engine64 = RolloutEngine(build_policy(CFG, tok).double(), decoder=OFTDecoder())
    with pytest.raises(RuntimeError, match="checksum"):
        sync_weights(actor.policy, engine64, version=5, bucket_mb=1)


def test_an_unverified_sync_still_copies_everything(actor_and_engine):
    actor, _ = actor_and_engine
    torch.manual_seed(7)
    engine = RolloutEngine(build_policy(CFG, WordTokenizer.from_instructions(instructions())), decoder=OFTDecoder())
    report = sync_weights(actor.policy, engine, version=9, bucket_mb=0.01, verify=False)
    assert report.checksum == "" and engine.version == 9
    full = [(n, t.clone()) for bucket in gathered_buckets(actor.policy, 1) for n, t in bucket]
    assert weights_checksum(full) == engine.checksum()


def test_engine_weights_lie_end_to_end_in_parameter_order(actor_and_engine):
    _, engine = actor_and_engine
    for round_trip in (False, True):
        if round_trip:
            engine.release_memory_occupation()
            engine.resume_memory_occupation()
        params = list(engine.policy.parameters())
        assert len({p.untyped_storage().data_ptr() for p in params}) == len({p.dtype for p in params})
        for a, b in pairwise(params):
            end = a.data_ptr() + a.nbytes
            assert b.data_ptr() == end or (end % 16 and b.data_ptr() == end + -end % 16)  # padded only to align
    sync_weights(actor_and_engine[0].policy, engine, version=10, bucket_mb=1)  # refill for the tests after


def test_a_bucket_of_engine_weights_is_compared_in_place(actor_and_engine):
    _, engine = actor_and_engine
    params = list(engine.policy.parameters())
    run = [params[0]]
    for p in params[1:]:
        if p.data_ptr() != run[-1].data_ptr() + run[-1].nbytes:
            break
        run.append(p)
    assert len(run) > 1
    whole = _end_to_end(run)
    assert whole.data_ptr() == run[0].data_ptr() and whole.numel() == sum(p.numel() for p in run)
    assert torch.equal(whole, torch.cat([p.reshape(-1) for p in run]))
    apart = [params[1], params[0]]  # not in storage order: concatenated
    assert torch.equal(_end_to_end(apart), torch.cat([p.reshape(-1) for p in apart]))


class _CorruptingEngine(RolloutEngine):
    """An engine whose copy goes wrong in one element of one bucket (as a faulty transfer would)."""

    def update_weights_from_tensor(self, named_tensors, version):
        named_tensors = list(named_tensors)
        super().update_weights_from_tensor(named_tensors, version)
        with torch.no_grad():
            dict(self.policy.named_parameters())[named_tensors[-1][0]].view(-1)[-1] += 1


def test_sync_raises_when_a_copied_bit_differs(actor_and_engine):
    actor, _ = actor_and_engine
    engine = _CorruptingEngine(build_policy(CFG, WordTokenizer.from_instructions(instructions())),
                               decoder=OFTDecoder())
    with pytest.raises(RuntimeError, match="differ from the actor's gathered weights"):
        sync_weights(actor.policy, engine, version=11, bucket_mb=1)


def test_each_tensor_of_a_bucket_is_fingerprinted_by_one_rank_in_runs():
    from vla_scale.parallel.sync.weight_sync import _share

    bucket = [(f"t{i}", torch.zeros(n)) for i, n in enumerate([5, 100, 3, 40, 40, 7, 60, 1])]
    for world in (1, 2, 3):
        shares = [_share(bucket, rank, world) for rank in range(world)]
        assert [name for share in shares for name in share] == [name for name, _ in bucket]  # once each, in order
    assert _share(bucket, 0, 2) == ["t0", "t1", "t2"] and _share(bucket, 1, 2) == ["t3", "t4", "t5", "t6", "t7"]
    assert _share([("empty", torch.zeros(0))], 0, 2) == ["empty"]
