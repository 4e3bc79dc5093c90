"""The command line an entry script gets from a launcher (deepspeed, torchrun) or a user, made ready for Hydra.

The deepspeed launcher appends `--local_rank=N`; Hydra would reject it, so it is moved into LOCAL_RANK. Under a
launcher (WORLD_SIZE > 1) the process group is created before Hydra runs and rank 0's run directory is handed to
every rank, so all ranks share one directory instead of one timestamp each. A resumed run writes no new Hydra record.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from typing import Any


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


def hydra_argv(argv: list[str]) -> list[str]:
    """`argv` (sys.argv) as Hydra should parse it in a launched entry script."""
    return _keep_run_record(_shared_run_dir(_strip_local_rank(argv)))


def run_to_the_end(make: Callable[[], Any], done: type[Exception], errors: tuple[type[Exception], ...] = ()
                   ) -> tuple[Any, dict[str, float]] | None:
    """An entry script's run of a trainer (the RL `Trainer` or the `SupervisedTrainer`): `make()` builds it (its
    checks before anything starts: a ConfigError exits with the message), rank 0 prints where the run writes and the
    policy line, then it trains; SIGTERM exits with the stop's exit code after saying how to resume, `errors` (and a
    failed checkpoint or log write) exit with their message. None when `make` raised `done` (a resumed run already
    at its end: nothing to do); else (trainer, final metrics)."""
    from vla_scale.checkpoint import CheckpointWriteError
    from vla_scale.config import ConfigError
    from vla_scale.run_log import RunLogError
    from vla_scale.stop_signals import EXIT_CODE, Preempted

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a file-size limit: a write fails with an error we report
    try:
        trainer = make()
    except ConfigError as err:
        sys.exit(f"error: {err}")
    except done as finished:
        print(finished, flush=True)
        return None
    if trainer.rank == 0:
        print(f"run directory: {trainer.run_dir}\ntensorboard:   tensorboard --logdir "
              f"{os.path.join(trainer.run_dir, 'tb')}\npolicy:        {trainer.vla.describe(trainer.cfg.env)}",
              flush=True)
    try:
        metrics = trainer.train()
    except Preempted as stopped:
        print(stopped, flush=True)
        sys.exit(EXIT_CODE)
    except (CheckpointWriteError, RunLogError, *errors) as err:
        sys.exit(f"error: {err}")
    finally:
        trainer.close()
    return trainer, metrics
