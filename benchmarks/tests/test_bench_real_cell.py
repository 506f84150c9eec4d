"""A real cell, end to end through the sweep's subprocess: eager on `ie-synthetic/llama`, tiny sizes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ie_bench.cells import load_cells
from ie_bench.spec import WORKLOADS


def test_sweep_runs_a_real_eager_cell_and_reports_it(tmp_path: Path) -> None:
    cells_dir, results = tmp_path / "cells", tmp_path / "results.md"
    cmd = [sys.executable, "-m", "ie_bench", "sweep", "--profile", "tiny", "--models", "synthetic-llama",
           "--variants", "eager", "--cells-dir", str(cells_dir), "--log-dir", str(tmp_path / "logs"),
           "--results", str(results), "--no-publish"]  # fmt: skip
    subprocess.run(cmd, check=True, timeout=120, capture_output=True)
    (cell,) = load_cells(cells_dir)
    assert cell["status"] == "ok", cell["error"] or {
        k: w["detail"] for k, w in cell["workloads"].items() if w["status"] != "ok"
    }
    assert {k: w["status"] for k, w in cell["workloads"].items()} == {
        w.key: "ok" for w in WORKLOADS
    }
    assert cell["load"]["dtype_resolved"] == "float32"
    assert cell["model"]["n_layers"] > 0
    assert cell["workloads"]["generate"]["detail"]["new_tokens"] == 4
    text = results.read_text()
    assert "`synthetic-llama`" in text and "Profile `tiny`" in text
