"""Several ranks weigh episodes as one rank would: the same episodes, split unevenly over 2 gloo ranks (DeepSpeed
averaging the ranks' gradients) or all on 1, give the same gradient of the step's loss, for both loss aggregations.
Real DeepSpeed engines under torch's launcher; the gradients are read when the optimizer is about to step."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, TINY_MODEL, script_env

SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import torch
    from hydra import compose, initialize_config_dir
    from vla_scale.parallel.actor import Actor
    from vla_scale.config import register_configs, to_config
    from vla_scale.envs.types import TaskSpec
    from vla_scale.batches import Trajectory
    from vla_scale.batches import StepBatch
    from vla_scale.trainer import Trainer

    out, root, *overrides = sys.argv[1:]
    register_configs()
    with initialize_config_dir(config_dir=root + "/configs", version_base="1.3"):
        cfg = to_config(compose(config_name="config", overrides=overrides))
    trainer = Trainer(cfg, "/tmp/unused")  # the checks only: no Ray, no simulator
    cfg = trainer.cfg
    m, side = cfg.model, trainer.processor.transform.image_size
    rng = np.random.default_rng(0)

    def episode(group, i):  # recorded data of one episode: 1-4 chunk steps, the last one cut short
        steps = int(rng.integers(1, 5))
        t = Trajectory(TaskSpec("reach", group % 3, i), f"g{group}", "reach the red block")
        for k in range(steps):
            t.images.append(rng.integers(0, 256, (1, side, side, 3), dtype=np.uint8))
            t.proprio.append(rng.standard_normal(m.proprio_dim))
            t.tokens.append(rng.integers(0, m.n_bins, m.chunk_len * m.action_dim))
            t.executed.append(m.chunk_len if k < steps - 1 else int(rng.integers(1, m.chunk_len + 1)))
            t.logprobs.append(-rng.random(m.chunk_len * m.action_dim).astype(np.float32) * 6)
            t.versions.append(0)
        t.success = i % 2 == 0
        return t

    groups = [[episode(g, i) for i in range(cfg.algo.group_size)] for g in range(3)]
    rank, world = trainer.rank, trainer.world
    mine = groups if world == 1 else [groups[:2], groups[2:]][rank]  # uneven: 2 groups and 1
    grads = {}

    def capture(optimizer, *_):
        for name, p in trainer.actor.policy.named_parameters():
            if p.grad is not None:
                grads[name] = p.grad.detach().double().clone()

    from dataclasses import replace
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    register_optimizer_step_pre_hook(capture)
    found = {}
    for agg in ("token_mean", "trajectory_mean"):
        trainer.cfg = replace(cfg, algo=replace(cfg.algo, loss_agg=agg))
        torch.manual_seed(0)
        trainer.actor = Actor(trainer.vla.new_policy, cfg.deepspeed, trainer.cfg.algo,
                              scorer=trainer.vla.chunk_scorer(), lora=cfg.model.lora)
        trainer.update(StepBatch(mine, 0.5, 1, len(mine) * cfg.algo.group_size))
        found[agg] = {k: v.flatten().tolist() for k, v in grads.items()}
    if rank == 0:
        json.dump(found, open(out, "w"))
""")

OVERRIDES = [*TINY_MODEL, "deepspeed.zero_stage=0", "algo.mini_batches=1", "algo.micro_batches=2", "algo.batch_size=2"]


def _gradients(tmp_path: Path, ranks: int) -> dict[str, dict[str, np.ndarray]]:
    """{loss aggregation: {parameter: gradient}} of one update on `ranks` ranks."""
    script, out = tmp_path / "grads.py", tmp_path / f"grads_{ranks}.json"
    script.write_text(SCRIPT)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}", f"--master_port={port}",
           str(script), str(out), str(ROOT), *OVERRIDES]
    proc = subprocess.run(cmd, env=script_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return {agg: {k: np.array(v) for k, v in grads.items()} for agg, grads in json.loads(out.read_text()).items()}


@pytest.mark.slow
def test_two_uneven_ranks_give_one_ranks_gradient(tmp_path: Path) -> None:
    ones, twos = _gradients(tmp_path, 1), _gradients(tmp_path, 2)
    for agg in ("token_mean", "trajectory_mean"):
        one, two = ones[agg], twos[agg]
        assert one.keys() == two.keys() and one
        scale = max(np.abs(g).max() for g in one.values())
        worst = max(np.abs(one[k] - two[k]).max() for k in one)
        assert scale > 0 and worst <= 1e-5 * scale, (agg, worst, scale)
