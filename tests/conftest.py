"""Shared test setup: offscreen rendering, local Ray without auth, a cached DeepSpeed op folder."""

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(ROOT / ".cache" / "torch_extensions"))
sys.path.insert(0, str(ROOT / "src"))

import pytest  # noqa: E402

LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def script_env() -> dict[str, str]:
    """The environment of an entry script run by a test: this process's, without the process-group variables that
    in-process tests may have set (a script would try to bind their port), one intra-op thread, our sources first."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    path = os.pathsep.join(p for p in [str(ROOT / "src"), env.get("PYTHONPATH", "")] if p)
    return dict(env, PYTHONPATH=path, OMP_NUM_THREADS="1")


TINY_MODEL = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1", "model.vision_dim=32",
              "model.num_heads=2"]
"""The default policy shrunk to a few thousand parameters."""
TINY_ALGO = ["algo.batch_size=2", "algo.group_size=4", "algo.mini_batches=1", "algo.max_resample_rounds=0",
             "algo.filter_low=0", "algo.filter_high=1"]
"""One small update a step, every group kept."""
TINY_ENV = ["parallel.num_workers=1", "parallel.sims_per_worker=2", "env.num_eval_init_states=2"]
"""Two simulators, two evaluation episodes per task."""
TINY = [*TINY_MODEL, *TINY_ALGO, *TINY_ENV, "env.max_steps=16", "progress=false"]
"""Overrides that shrink the embedded default run to a few seconds a step."""


def run_script(script: str, *args: str, env: dict[str, str] | None = None, cwd: Path = ROOT,
               timeout: int = 400) -> subprocess.CompletedProcess[str]:
    """Run `launch/<script>.py` with `args` as a user would, output captured."""

    return subprocess.run([sys.executable, str(ROOT / "launch" / f"{script}.py"), *args], cwd=cwd,
                          env=env or script_env(), capture_output=True, text=True, timeout=timeout)


def two_ranks(*args: str) -> list[str]:
    """The deepspeed launcher's command running launch/train.py `args` on two ranks, on a free port: tests in other
    files may launch at the same time, and the launcher's default port would then be taken."""
    deepspeed = Path(sys.executable).with_name("deepspeed")  # else the one on PATH (wheels installed elsewhere)
    deepspeed = deepspeed if deepspeed.exists() else Path(shutil.which("deepspeed") or deepspeed)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return [str(deepspeed), "--num_gpus", "2", "--master_port", str(port), str(ROOT / "launch" / "train.py"), *args]


def train_ok(*overrides: str, flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """launch/train.py with TINY and `overrides`; it must succeed."""
    proc = run_script("train", *flags, *TINY, *overrides)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


STACK = ("torch", "hydra", "mujoco", "ray", "deepspeed", "gymnasium", "psutil")
"""What the suite imports from the pinned stack (setup.py); without it every module fails to collect."""


def pytest_configure(config: pytest.Config) -> None:
    import importlib.util

    missing = [name for name in STACK if importlib.util.find_spec(name) is None]
    if missing:
        pytest.exit(f"{sys.executable} lacks {', '.join(missing)}: the suite runs in the project's environment. "
                    "Run `make test` (it creates .venv and installs the pinned stack), or `.venv/bin/python -m pytest`",
                    returncode=4)


@pytest.fixture
def tiny_config():
    """A typed Config of the shipped defaults, shrunk to run a few RL steps in seconds."""
    from hydra import compose, initialize_config_dir

    from vla_scale.config import register_configs, to_config

    def make(*overrides: str):
        register_configs()
        small = [*TINY_MODEL, *TINY_ALGO, *TINY_ENV, "progress=false", "save_every=0"]
        with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
            return to_config(compose(config_name="config", overrides=small + list(overrides)))

    return make


@pytest.fixture(scope="session")
def saved_run(tmp_path_factory) -> Path:
    """A run of 3 uninterrupted TINY steps, saving after each; read-only for its users (copy it to change it)."""
    run = tmp_path_factory.mktemp("saved_run")
    train_ok("steps=3", "eval_every=10", "save_every=1", f"run_dir={run}")
    return run


def read_scalars(tb_dir: str) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series in a TensorBoard directory, as {tag: [(step, value), ...]} sorted by step."""
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    acc = EventAccumulator(tb_dir, size_guidance={SCALARS: 0})
    acc.Reload()
    return {tag: sorted((e.step, e.value) for e in acc.Scalars(tag)) for tag in acc.Tags()["scalars"]}


def read_text_tags(tb_dir: str) -> dict[str, list[tuple[int, str]]]:
    """Every text series in a TensorBoard directory, as {tag: [(step, text), ...]} sorted by step."""
    from tensorboard.backend.event_processing.event_accumulator import TENSORS, EventAccumulator
    from tensorboard.util.tensor_util import make_ndarray

    acc = EventAccumulator(tb_dir, size_guidance={TENSORS: 0})
    acc.Reload()
    out = {}
    for tag in acc.Tags()["tensors"]:
        if tag.endswith("/text_summary"):
            texts = [(e.step, make_ndarray(e.tensor_proto).item().decode()) for e in acc.Tensors(tag)]
            out[tag.removesuffix("/text_summary")] = sorted(texts)
    return out
