"""What a simulator process costs to start, by what its parent script imports at the top.

Each row runs a small launcher script in a fresh interpreter; the launcher imports the row's modules at its top, as
a training script would, then starts `SimProcess`es of the embedded task one after another and reports the time to
each one's first answer (a reset: interpreter start, imports, building and rendering the env) and the child's
resident memory then. A child that re-ran its parent's script would import the parent's modules too.

    python benchmarks/sim_start.py [--starts 3] [--resolution 64]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PARENTS = {
    "nothing": "",
    "hydra and vla_scale.config (launch/train.py)": "import hydra\nfrom vla_scale.config import register_configs",
    "torch": "import torch",
    "ray": "import ray",
}

LAUNCHER = '''
{imports}

if __name__ == "__main__":
    import sys, time
    from vla_scale.envs.sim_process import SimProcess
    from vla_scale.envs.types import TaskSpec

    for _ in range(int(sys.argv[1])):
        start = time.perf_counter()
        with SimProcess("reach", num_slots=1, env_kwargs={{"camera_resolution": int(sys.argv[2])}}) as proc:
            proc.send_reset([TaskSpec("reach", 0, 0)])
            proc.recv(timeout_s=120.0)
            seconds = time.perf_counter() - start
            with open(f"/proc/{{proc.pid}}/status") as status:
                rss = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
        print(f"{{seconds:.3f}} {{rss / 1024:.1f}}")
'''


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--starts", type=int, default=3, help="simulator processes started per parent, one at a time")
    p.add_argument("--resolution", type=int, default=64)
    args = p.parse_args()
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))}
    print(f"{'parent imports at its top':<48} {'first answer s (median)':>24} {'child RSS MiB':>14}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, imports in PARENTS.items():
            script = Path(tmp) / "launcher.py"
            script.write_text(LAUNCHER.format(imports=imports))
            run = subprocess.run([sys.executable, str(script), str(args.starts), str(args.resolution)], env=env,
                                 capture_output=True, text=True, timeout=600)
            if run.returncode:
                print(f"{name:<48} failed: {run.stderr.strip().splitlines()[-1:]}")
                continue
            rows = [tuple(map(float, line.split())) for line in run.stdout.split("\n") if line.strip()]
            print(f"{name:<48} {statistics.median(r[0] for r in rows):>24.2f} "
                  f"{statistics.median(r[1] for r in rows):>14.0f}")


if __name__ == "__main__":
    main()
