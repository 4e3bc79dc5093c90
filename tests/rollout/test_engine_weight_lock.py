"""A weight sync never lands in the middle of a decode (`algo.max_staleness=1` decodes in the rollout thread while the
trainer syncs): every decode, while syncs of two alternating weight sets run in many small buckets, gives exactly
what the version it reports decodes alone."""

import threading
import time

import numpy as np
import torch

from vla_scale.config import ModelConfig
from vla_scale.envs.reach import instructions
from vla_scale.envs.types import Observation
from vla_scale.models.oft import Processor
from vla_scale.models.oft.decode import OFTDecoder
from vla_scale.models.tokenizer import WordTokenizer
from vla_scale.parallel.sync.weight_sync import sync_weights
from vla_scale.rollout.engine import RolloutEngine
from vla_scale.run_policy import build_policy

CFG = ModelConfig(image_size=32, patch_size=8, vision_dim=32, hidden_size=32, num_layers=2, num_heads=2,
                  intermediate_size=64, chunk_len=4)


def test_decodes_in_another_thread_see_one_version_of_the_weights():
    tok = WordTokenizer.from_instructions(instructions())
    torch.manual_seed(0)
    sources = [build_policy(CFG, tok), build_policy(CFG, tok)]  # two weight sets: versions even / odd
    engine = RolloutEngine(build_policy(CFG, tok), decoder=OFTDecoder())
    rng = np.random.default_rng(0)
    obs = [Observation({"agentview": rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)},
                       rng.normal(size=4).astype(np.float32), instructions()[0]) for _ in range(4)]
    batch = Processor.for_spec(engine.policy.spec, tok)(obs)
    alone = []
    for version, source in enumerate(sources):
        sync_weights(source, engine, version, bucket_mb=0.001)
        alone.append(engine.decode(batch, 1.0, greedy=True).logprobs)
    assert not np.array_equal(alone[0], alone[1])

    seen: list[tuple[int, np.ndarray]] = []
    stop = threading.Event()

    def decode_until_stopped() -> None:
        while not stop.is_set():
            decoded = engine.decode(batch, 1.0, greedy=True)
            seen.append((decoded.version, decoded.logprobs))

    reader = threading.Thread(target=decode_until_stopped)
    reader.start()
    try:
        for version in range(2, 40):
            report = sync_weights(sources[version % 2], engine, version, bucket_mb=0.001)
            assert report.buckets > 10
            decoded = len(seen)  # the lock is not fair: let the reader decode once before the next sync starts
            while len(seen) == decoded and reader.is_alive():
                time.sleep(0.001)
    finally:
        stop.set()
        reader.join()
    assert len({version for version, _ in seen}) > 5  # decodes ran between many of the syncs
    for version, logprobs in seen:
        assert np.array_equal(logprobs, alone[version % 2]), f"a decode reporting v{version} saw other weights"
