"""The command line an entry script gets from a launcher (deepspeed, torchrun) or a user, made ready for Hydra, and
the run's log file.

The deepspeed launcher appends `--local_rank=N`; Hydra would reject it, so it is moved into LOCAL_RANK. Under a
launcher (WORLD_SIZE > 1) the process group is created before Hydra runs and rank 0's run directory is handed to
every rank, so all ranks share one directory instead of one timestamp each. A resumed run writes no new Hydra record.
Once a run's checks pass, everything its console shows is also appended to `<run_dir>/<script>.log` (`train.log`,
`sft.log`, `demonstrate.log`): `copy_console_to`.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
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


def hydra_argv(argv: list[str]) -> list[str]:
    """`argv` (sys.argv) as Hydra should parse it in a launched entry script."""
    return _keep_run_record(_shared_run_dir(_strip_local_rank(argv)))


def checks_first_argv(argv: list[str]) -> list[str]:
    """`argv` for a script that makes its run directory itself once its checks pass (launch/demonstrate.py): Hydra
    writes nothing (the working directory as its own, no `.hydra/` record, console logging only), and a
    `hydra.run.dir=X` given without `run_dir=` becomes `run_dir=X`; `write_run_record` then writes Hydra's record."""
    named = [a.split("=", 1)[1] for a in argv if a.startswith("hydra.run.dir=")]
    kept = [a for a in argv if not a.startswith(("hydra.run.dir=", "hydra.output_subdir=", "hydra/job_logging="))]
    if named and not any(a.startswith("run_dir=") for a in argv):
        kept.append(f"run_dir={named[-1]}")
    return kept + _HYDRA_WRITES_NOTHING


_HYDRA_WRITES_NOTHING = ["hydra.run.dir=.", "hydra.output_subdir=null", "hydra/job_logging=stdout"]


def write_run_record(run_dir: str, task_cfg: DictConfig) -> None:
    """Hydra's record of this run in `run_dir/.hydra/` (config.yaml, hydra.yaml, overrides.yaml, as Hydra writes
    them, with `run_dir` as Hydra's directory), then the console copied to the run's log file."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    hydra_cfg = OmegaConf.create(OmegaConf.to_container(HydraConfig.instance().cfg))  # a copy, writable
    hydra_cfg.hydra.run.dir = run_dir
    hydra_cfg.hydra.runtime.output_dir = os.path.abspath(run_dir)
    hydra_cfg.hydra.output_subdir = ".hydra"
    hydra_cfg.hydra.overrides.hydra = [o for o in hydra_cfg.hydra.overrides.hydra if o not in _HYDRA_WRITES_NOTHING]
    record = os.path.join(run_dir, ".hydra")
    os.makedirs(record, exist_ok=True)
    for name, node in [("config.yaml", task_cfg), ("hydra.yaml", hydra_cfg),
                       ("overrides.yaml", hydra_cfg.hydra.overrides.task)]:
        with open(os.path.join(record, name), "w", encoding="utf-8") as f:
            f.write(OmegaConf.to_yaml(node))
    copy_console_to(run_log_path(run_dir))


class RunLogFile:
    """The run's log file, appended to by the console's copies (one lock for stdout and stderr); a write the file
    refuses (a full disk, a file-size limit) ends the copying, never the run."""

    def __init__(self, path: str):
        self.lock = threading.Lock()
        self.file: TextIO | None = None
        try:
            self.file = open(path, "a", encoding="utf-8")  # open for the rest of the process
        except OSError:
            pass

    def append(self, lines: list[str]) -> None:
        shown = [line for line in map(_as_shown, lines) if line is not None]
        if self.file is None or not shown:
            return
        try:
            self.file.write("".join(line + "\n" for line in shown))
            self.file.flush()
        except (OSError, ValueError):  # ValueError: written at interpreter exit, once the file is closed
            self.file = None


class ConsoleCopy:
    """A console stream (sys.stdout, sys.stderr) whose finished lines are also appended to the run's log file; a line
    a progress bar redraws (carriage returns) reaches the file once, as last drawn, and a nested bar's not at all."""

    def __init__(self, console: TextIO, log: RunLogFile):
        self.console, self.log = console, log
        self.pending = ""

    def write(self, text: str) -> int:
        with self.log.lock:
            lines = (self.pending + text).split("\n")
            self.pending = "\r".join(lines.pop().split("\r")[-2:])  # a bar's redraws: only the last is kept
            self.log.append(lines)
        return self.console.write(text)

    def flush(self) -> None:
        self.console.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.console, name)


def _as_shown(line: str) -> str | None:
    """What a terminal keeps of `line`: its last drawn part between carriage returns (a progress bar's redraws);
    None for one only cleared or drawn above the cursor's line, which a later one overwrites (a nested progress
    bar's, `ESC[A`)."""
    if "\r" not in line and "\x1b[A" not in line:
        return line
    drawn = [p for p in line.split("\r") if p.strip()]
    return drawn[-1] if drawn and "\x1b[A" not in drawn[-1] else None


def run_log_path(run_dir: str) -> str:
    """`<run_dir>/<job>.log`, the file Hydra's job logging writes (`train.log` for launch/train.py)."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        return os.path.join(run_dir, f"{HydraConfig.get().job.name}.log")
    return os.path.join(run_dir, os.path.splitext(os.path.basename(sys.argv[0]))[0] + ".log")


def copy_console_to(path: str) -> None:
    """From now on every line this process writes to stdout or stderr (its own lines, an error it exits with, a
    progress bar's last state) is also appended to `path`. Logging's handlers keep the streams they were made with
    where Hydra's job logging writes the file already, so no record is written twice."""
    if isinstance(sys.stdout, ConsoleCopy):
        return
    log = RunLogFile(path)
    copies = {stream: ConsoleCopy(stream, log) for stream in (sys.stdout, sys.stderr)}
    sys.stdout, sys.stderr = copies[sys.stdout], copies[sys.stderr]
    _console_records_too(path, copies)


def _console_records_too(path: str, copies: dict[TextIO, ConsoleCopy]) -> None:
    """Where no handler of the root logger writes `path` (a resumed run's `hydra/job_logging=stdout`), its console
    handlers write through the copies, so the log records the console shows reach the file too."""
    import logging

    root = logging.getLogger()
    if any(isinstance(h, logging.FileHandler) and h.baseFilename == os.path.abspath(path) for h in root.handlers):
        return
    for handler in root.handlers:
        if type(handler) is logging.StreamHandler and handler.stream in copies:
            handler.setStream(copies[handler.stream])


def run_to_the_end(make: Callable[[], Any], done: type[Exception], errors: tuple[type[Exception], ...] = ()
                   ) -> tuple[Any, dict[str, float]] | None:
    """An entry script's run of a trainer (the RL `Trainer` or the `SupervisedTrainer`): `make()` builds it (its
    checks before anything starts: a ConfigError exits with the message), rank 0 prints where the run writes and the
    policy line, then it trains; SIGTERM exits with the stop's exit code after saying how to resume, `errors` (and a
    failed checkpoint or log write) exit with their message. None when `make` raised `done` (a resumed run already
    at its end: nothing to do); else (trainer, final metrics). From the `run directory:` line on, rank 0's console
    is also appended to the run's log file (`train.log`, `sft.log`): a refused or finished resume writes nothing
    there."""
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
        copy_console_to(run_log_path(trainer.run_dir))
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
