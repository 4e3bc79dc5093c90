"""Where the entry scripts write: launch/demonstrate.py's run directory (the one named, else beside the dataset; none
for a refused command; never one shared), its progress over episodes, and the run's log file holding what the console
shows (`launcher.run_to_the_end`, shared by launch/train.py and launch/sft.py)."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import ROOT, run_script, script_env

from vla_scale.config import ConfigError
from vla_scale.launcher import ConsoleCopy, run_to_the_end

DEMOS = ["env=pick_place", "demo.episodes=2"]
"""Two scripted pick_place demonstrations: a few seconds."""


def test_a_refused_demonstration_leaves_nothing_behind(tmp_path: Path) -> None:
    proc = run_script("demonstrate", "env=reach", "run_dir=named", cwd=tmp_path, timeout=100)
    assert proc.returncode == 1 and "has no scripted demonstrator" in proc.stderr, proc.stderr[-3000:]
    assert list(tmp_path.iterdir()) == []  # neither runs/<time>/ nor the named run directory


def test_two_demonstrations_at_once_write_their_own_run_directories(tmp_path: Path) -> None:
    """Started together: one without run_dir (its record beside its dataset) and plain progress lines, one with
    run_dir and the progress bar; each directory holds Hydra's record and a log of what its console showed."""
    commands = [[*DEMOS, "record.path=a", "progress=false"], [*DEMOS, "record.path=b", "run_dir=named"]]
    procs = [subprocess.Popen([sys.executable, str(ROOT / "launch" / "demonstrate.py"), *args], cwd=tmp_path,
                              env=script_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for args in commands]
    (out_a, err_a), (out_b, err_b) = (p.communicate(timeout=200) for p in procs)
    assert [p.returncode for p in procs] == [0, 0], (err_a + err_b)[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "a_run", "b", "named"]
    assert "episodes 1/2: " in out_a and "episodes 2/2: " in out_a  # progress=false: plain lines
    assert "demonstrate: 100%" in err_b and "| 2/2 [" in err_b and "success=" in err_b
    for run, out in [(tmp_path / "a_run", out_a), (tmp_path / "named", out_b)]:
        assert (run / ".hydra" / "config.yaml").is_file() and (run / ".hydra" / "overrides.yaml").is_file()
        log = (run / "demonstrate.log").read_text()
        assert out.strip().splitlines()[-1].startswith("demonstrate: episodes=2 ")
        assert all(line in log for line in out.splitlines()), log
    assert "hydra:\n  run:\n    dir: named\n" in (tmp_path / "named" / ".hydra" / "hydra.yaml").read_text()


class Finished(Exception):
    pass


class FakeTrainer:
    """What `run_to_the_end` asks of a trainer; its train() prints a line and draws a progress bar."""

    def __init__(self, run_dir: Path):
        self.rank, self.run_dir, self.cfg = 0, str(run_dir), SimpleNamespace(env=None)
        self.vla = SimpleNamespace(describe=lambda env: "a fake policy")

    def train(self) -> dict[str, float]:
        print("training steps 1-2", flush=True)
        logging.getLogger("vla_scale.fake").warning("sim worker 0 replaced")
        sys.stderr.write("\rtrain:   0%| 0/2\rtrain:  50%| 1/2\rtrain: 100%| 2/2 [loss=0.5]\n")
        return {"loss": 0.5}

    def close(self) -> None:
        pass


@pytest.fixture
def console(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Console]:
    """The console as a test's `capsys` has it, the script named train.py; SIGXFSZ's handler restored after."""
    monkeypatch.setattr(sys, "argv", ["train.py"])
    before = signal.getsignal(signal.SIGXFSZ)
    yield Console(capsys)
    signal.signal(signal.SIGXFSZ, before)


class Console:
    def __init__(self, capsys: pytest.CaptureFixture[str]):
        self.capsys = capsys

    def shown(self) -> str:
        """stdout and stderr so far; the run log's file closed."""
        if isinstance(sys.stdout, ConsoleCopy) and sys.stdout.log.file is not None:
            sys.stdout.log.file.close()
        out, err = self.capsys.readouterr()
        return out + err


def test_the_run_log_holds_what_the_console_shows(tmp_path: Path, console: Console) -> None:
    trainer, metrics = run_to_the_end(lambda: FakeTrainer(tmp_path), Finished)
    print("train: steps=2 eval_success_rate=0.500", flush=True)  # the script's last line, after the run
    shown, log = console.shown(), (tmp_path / "train.log").read_text()
    for line in ["run directory: ", "policy:        a fake policy", "training steps 1-2",
                 "train: steps=2 eval_success_rate=0.500"]:
        assert line in shown and line in log, log
    assert "train: 100%| 2/2 [loss=0.5]\n" in log and "50%" not in log  # a progress bar's last state only
    assert metrics == {"loss": 0.5}


def test_a_resumed_run_log_gets_the_console_log_records_too(tmp_path: Path, console: Console) -> None:
    """A resumed run's logging goes to the console only (`hydra/job_logging=stdout`): its records reach the run's
    log through the console's copy, as a fresh run's reach it through Hydra's file handler."""
    root = logging.getLogger()
    handler = logging.StreamHandler(sys.stdout)
    root.addHandler(handler)
    try:
        run_to_the_end(lambda: FakeTrainer(tmp_path), Finished)
    finally:
        root.removeHandler(handler)
    assert "sim worker 0 replaced" in console.shown()
    assert (tmp_path / "train.log").read_text().count("sim worker 0 replaced") == 1


@pytest.mark.parametrize("refusal", [ConfigError("cannot resume"), Finished("already at step 3")])
def test_a_refused_or_finished_resume_writes_no_log(tmp_path: Path, console: Console, refusal: Exception) -> None:
    def make() -> FakeTrainer:
        raise refusal

    if isinstance(refusal, ConfigError):
        with pytest.raises(SystemExit, match="cannot resume"):
            run_to_the_end(make, Finished)
    else:
        assert run_to_the_end(make, Finished) is None
    print("a later line")
    assert "a later line" in console.shown() and list(tmp_path.iterdir()) == []


@pytest.mark.slow  # saved_run: a 3-step training run
def test_a_training_run_log_holds_its_own_lines(saved_run: Path) -> None:
    log = (saved_run / "train.log").read_text()
    assert "policy:        a fresh model=tiny" in log and "training steps 1-3" in log, log
    assert "train: steps=3 eval_success_rate=" in log, log
