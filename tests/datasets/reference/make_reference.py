"""Writes the reference files beside it as LeRobot 0.4.4 writes them, with the same library calls, for
tests/datasets/test_lerobot.py to compare the project's files against. Run once, in a virtual environment of its own
with pandas 2.3.3 and pyarrow 26.0.1 (LeRobot 0.4.4's pins allow them):

    python3 -m venv /tmp/reference && /tmp/reference/bin/pip install "pandas==2.3.3" "pyarrow==26.0.1"
    /tmp/reference/bin/python tests/datasets/reference/make_reference.py

tasks.parquet: meta/tasks.parquet of three tasks, as LeRobotDatasetMetadata.save_episode_tasks builds the frame
(the first episode's task, then each new one added with .loc) and lerobot.datasets.utils.write_tasks stores it.
"""

from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
TASKS = ["put the red cube in the bowl", "open the drawer", "stack the blocks"]

if __name__ == "__main__":
    tasks = pd.DataFrame({"task_index": range(1)}, index=TASKS[:1])
    for index, task in enumerate(TASKS[1:], start=1):
        tasks.loc[task] = index
    tasks.to_parquet(HERE / "tasks.parquet")
