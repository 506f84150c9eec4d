"""A task whose data cannot be loaded is refused before the model loads (issue 68, item 7).

lm-eval loads the model first and builds its tasks after, so `arc_easy` without the Hub failed
after the model load (52 s here). `ie-lm-eval` now builds the tasks first. The command-line test
names a model folder that does not exist: had the model load come first, the error would be
about that folder; it must be the task data's refusal instead. It needs the Hub unreachable (as
here and in CI's sandbox) and is skipped where it is reachable (the stock task would download).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("lm_eval")

from evals_support import write_mc_task
from ie_evals.lm_eval_cli import requested_tasks
from ie_evals.task_data import TaskDataError, check_task_data, hub_reachable

DOCS = [{"question": "Is red a colour?", "choices": [" yes", " no"], "answer": 0}]


def test_a_stock_task_without_the_hub_is_refused_before_the_model_loads(tmp_path: Path) -> None:
    if hub_reachable():
        pytest.skip("the Hub is reachable: arc_easy's data would download")
    missing = tmp_path / "no-such-model"
    cmd = [sys.executable, "-m", "ie_evals.lm_eval_cli", "run", "--model", "interp-engine",
           "--tasks", "arc_easy", "--model_args", f"pretrained={missing},backend=eager"]  # fmt: skip
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    seconds = time.perf_counter() - start
    assert done.returncode == 2, done.stderr[-3000:]
    assert "the data of lm-eval task(s) arc_easy cannot be loaded" in done.stderr
    assert "The model was not loaded" in done.stderr
    assert str(missing) not in done.stderr  # nothing tried to load the model
    print(f"refused in {seconds:.1f} s (lm-eval's import and task index included)")


def test_a_local_task_passes_the_check_and_a_missing_file_does_not(tmp_path: Path) -> None:
    name = write_mc_task(tmp_path, "ie_check_local", DOCS)
    check_task_data(name, str(tmp_path))  # its jsonl is there: no error
    (tmp_path / f"{name}.jsonl").unlink()
    with pytest.raises(TaskDataError, match="ie_check_local cannot be loaded"):
        check_task_data(name, str(tmp_path))


def test_the_command_line_s_tasks_are_read_as_lm_eval_reads_them() -> None:
    argv = ["run", "--model", "interp-engine", "--tasks", "qa,arc_easy", "--include_path", "t"]
    assert requested_tasks(argv) == (["qa", "arc_easy"], "t")
    assert requested_tasks(["ls", "tasks"]) == ([], None)
    assert requested_tasks(["run", "--model", "hf"]) == ([], None)
