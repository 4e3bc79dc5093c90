"""Weight sync into an engine in another process: a 2-rank ZeRO-3 trainer broadcasts over gloo to an engine process."""

import multiprocessing as mp
import os
import queue
import socket

import pytest
import torch

from vla_scale.config import AlgoConfig, DeepSpeedConfig, ModelConfig
from vla_scale.envs.reach import instructions
from vla_scale.models.oft.decode import OFTDecoder, OFTScorer
from vla_scale.models.tokenizer import WordTokenizer
from vla_scale.run_policy import build_policy

CFG = ModelConfig(image_size=32, patch_size=8, vision_dim=32, hidden_size=32, num_layers=1, num_heads=2,
                  intermediate_size=64, chunk_len=4)
BUCKET_MB = 0.01  # several buckets even for this tiny model


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _trainer(rank: int, trainer_port: int, update_port: int, out: mp.Queue) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(trainer_port))
    import deepspeed

    from vla_scale.parallel.actor import Actor
    from vla_scale.parallel.sync.update_group import UpdateGroup, broadcast_sync
    from vla_scale.parallel.sync.weight_sync import gathered_buckets
    from vla_scale.run_setup import init_distributed
    from vla_scale.tensors.checksum import weights_checksum

    init_distributed()
    tok = WordTokenizer.from_instructions(instructions())
    torch.manual_seed(0)
    actor = Actor(lambda zero3: build_policy(CFG, tok, zero3), DeepSpeedConfig(zero_stage=3),
                  AlgoConfig(micro_batches=1), scorer=OFTScorer())
    group = UpdateGroup.connect("127.0.0.1", update_port, 0, 2, timeout_s=120) if rank == 0 else None
    for version in (1, 2):
        report = broadcast_sync(actor.policy, group, version, BUCKET_MB)
        full = weights_checksum([(n, t.clone()) for b in gathered_buckets(actor.policy, 0.01) for n, t in b])
        with deepspeed.zero.GatheredParameters(list(actor.policy.parameters())):  # DeepSpeed's own gather
            reference = weights_checksum([(n, p.data.clone()) for n, p in actor.policy.named_parameters()])
        out.put(("trainer", rank, version, report.checksum, report.buckets, full, reference))
        param = next(actor.policy.parameters())
        with deepspeed.zero.GatheredParameters([param], modifier_rank=0):
            if rank == 0:
                param.data.add_(1.0)  # the next sync must carry the change
    from vla_scale.parallel.sync.weight_sync import sync_weights
    from vla_scale.rollout.engine import RolloutEngine

    # the colocated layout too: each rank syncs its own engine
    own = RolloutEngine(build_policy(CFG, tok), decoder=OFTDecoder())
    report = sync_weights(actor.policy, own, 7, BUCKET_MB)  # each rank fingerprints half; one checksum of both
    out.put(("colocated", rank, report.checksum, own.checksum()))
    try:
        broadcast_sync(actor.policy, group, 3, BUCKET_MB)
        out.put(("trainer_v3", rank, "ok"))
    except RuntimeError as err:
        out.put(("trainer_v3", rank, str(err)))


def _engine(update_port: int, out: mp.Queue) -> None:
    from vla_scale.parallel.sync.update_group import WeightReceiver
    from vla_scale.rollout.engine import RolloutEngine

    torch.manual_seed(1)  # different weights from the actor's until the first sync
    engine = RolloutEngine(build_policy(CFG, WordTokenizer.from_instructions(instructions())), decoder=OFTDecoder())
    out.put(("engine_before", engine.checksum()))
    receiver = WeightReceiver.connect(engine, "127.0.0.1", update_port, rank_offset=1, world_size=2)
    for _ in (1, 2):
        report = receiver.receive_sync()
        out.put(("engine", report.version, engine.checksum(), engine.version))
    engine.policy.double()  # can no longer hold the actor's fp32 bytes exactly
    try:
        receiver.receive_sync()
        out.put(("engine_v3", "ok"))
    except RuntimeError as err:
        out.put(("engine_v3", str(err)))


@pytest.mark.slow
def test_two_rank_trainer_broadcasts_every_bucket_to_an_engine_process():
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()
    trainer_port, update_port = _port(), _port()
    procs = [ctx.Process(target=_trainer, args=(r, trainer_port, update_port, out)) for r in (0, 1)]
    procs.append(ctx.Process(target=_engine, args=(update_port, out)))
    for p in procs:
        p.start()
    messages = []
    try:
        while len(messages) < 12:
            messages.append(out.get(timeout=240))
    except queue.Empty:
        pytest.fail(f"the sync stalled; got {messages}")
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    by_kind: dict[str, list] = {}
    for m in messages:
        by_kind.setdefault(m[0], []).append(m[1:])
    sent = {(rank, version): (checksum, buckets, full)
            for rank, version, checksum, buckets, full, _ in by_kind["trainer"]}
    assert all(full == reference for *_, full, reference in by_kind["trainer"])  # one all-gather per bucket is exact
    received = {version: (checksum, engine_version) for version, checksum, engine_version in by_kind["engine"]}
    for version in (1, 2):
        checksum, buckets, full = sent[(0, version)]
        assert buckets > 1
        assert received[version] == (full, version)  # the engine holds exactly the actor's full weights
        assert checksum == full
        assert sent[(1, version)][0] == ""  # rank 1 gathers but does not send
        assert sent[(1, version)][2] == full
    assert sent[(0, 1)][2] != sent[(0, 2)][2]  # the change between the syncs arrived
    assert by_kind["engine_before"][0][0] != sent[(0, 1)][2]
    colocated = dict((rank, (checksum, held)) for rank, checksum, held in by_kind["colocated"])
    assert colocated[0] == colocated[1] and colocated[0][0] == colocated[0][1]  # the shares make the whole
    assert colocated[0][0] not in (sent[(0, 1)][2], sent[(0, 2)][2])  # it carries the change made after v2
    (engine_v3,) = by_kind["engine_v3"]
    v3 = dict(by_kind["trainer_v3"])
    assert "checksum" in engine_v3[0] and "checksum" in v3[0] and v3[1] == "ok"
