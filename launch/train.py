"""Hydra entry of the trainer: `python launch/train.py [overrides]`, `deepspeed launch/train.py`, `torchrun`.

The deepspeed launcher appends `--local_rank=N`; Hydra would reject it, so it is moved into LOCAL_RANK first.
Under a launcher (WORLD_SIZE > 1) the process group is created before Hydra runs, and rank 0's run directory is
handed to every rank, so all ranks share one directory instead of one timestamp each.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import warnings

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig


def _strip_local_rank(argv: list[str]) -> list[str]:
    kept = []
    for arg in argv:
        if arg.startswith("--local_rank="):
            os.environ.setdefault("LOCAL_RANK", arg.split("=", 1)[1])
        else:
            kept.append(arg)
    return kept


def _shared_run_dir(argv: list[str]) -> list[str]:
    """`run_dir=X` is also Hydra's directory; under a launcher every rank gets rank 0's timestamped directory."""
    named = [a.split("=", 1)[1] for a in argv if a.startswith("run_dir=")]
    if named and not any(a.startswith("hydra.run.dir=") for a in argv):
        return argv + [f"hydra.run.dir={named[-1]}"]
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or any(a.startswith(("hydra.run.dir=", "-m", "--multirun"))
                                                          for a in argv):
        return argv
    import time

    import torch.distributed as dist

    from vla_scale.run_setup import init_distributed

    init_distributed()
    choice = [time.strftime("runs/%Y-%m-%d_%H-%M-%S")]
    dist.broadcast_object_list(choice, src=0)
    return argv + [f"hydra.run.dir={choice[0]}"]


def _keep_run_record(argv: list[str]) -> list[str]:
    """A resumed run keeps the record Hydra wrote when it started (`.hydra/`) and its log file: a resume attempt
    writes neither, so one that is refused leaves the run directory as it was."""
    if not any(a.lower() in ("resume=true", "+resume=true", "++resume=true") for a in argv):
        return argv
    keep = [] if any(a.startswith("hydra.output_subdir=") for a in argv) else ["hydra.output_subdir=null"]
    if not any(a.startswith("hydra/job_logging=") for a in argv):
        keep.append("hydra/job_logging=stdout")
    return argv + keep


sys.argv = _keep_run_record(_shared_run_dir(_strip_local_rank(sys.argv)))
warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
logging.getLogger("DeepSpeed").setLevel(logging.WARNING)

from vla_scale.config import (  # noqa: E402
    ConfigError,
    explicit_keys,
    moved_key_error,
    register_configs,
    to_config,
    validate,
)

register_configs()
if moved := moved_key_error(sys.argv[1:]):
    sys.exit(moved)


@hydra.main(config_path="../configs", config_name="config", version_base="1.3")
def main(dict_cfg: DictConfig) -> float:
    cfg = to_config(dict_cfg)
    run_dir = cfg.run_dir or HydraConfig.get().runtime.output_dir
    try:  # the configuration first: it needs no DeepSpeed, whose import alone takes seconds
        validate(cfg, int(os.environ.get("WORLD_SIZE", "1")))
    except ConfigError as err:
        sys.exit(f"error: {err}")
    from vla_scale.checkpoint import CheckpointWriteError
    from vla_scale.run_log import RunLogError
    from vla_scale.stop_signals import EXIT_CODE, Preempted
    from vla_scale.trainer import RunComplete, SimulatorLost, Trainer

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a file-size limit: a write fails with an error we report

    try:  # the policy against the env, the Ray address, a resumed run's checkpoint: before anything starts
        trainer = Trainer(cfg, run_dir, explicit_keys(HydraConfig.get().overrides.task))
    except ConfigError as err:
        sys.exit(f"error: {err}")
    except RunComplete as done:
        print(done, flush=True)
        return float("nan")
    if trainer.rank == 0:
        print(f"run directory: {run_dir}\ntensorboard:   tensorboard --logdir {os.path.join(run_dir, 'tb')}\n"
              f"policy:        {trainer.vla.describe(trainer.cfg.env)}", flush=True)
    try:
        metrics = trainer.train()
    except Preempted as stopped:
        print(stopped, flush=True)
        sys.exit(EXIT_CODE)
    except (CheckpointWriteError, RunLogError, SimulatorLost) as err:
        sys.exit(f"error: {err}")
    finally:
        trainer.close()
    if trainer.rank == 0:
        print(f"run directory: {run_dir}")
        print("train: steps={} eval_success_rate={:.3f}".format(cfg.steps, metrics["eval/success_rate"]), flush=True)
    return metrics["eval/success_rate"]


if __name__ == "__main__":
    main()
