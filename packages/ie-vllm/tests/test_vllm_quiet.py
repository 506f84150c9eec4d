"""A plain vLLM script is quiet and ends with its own last line (issue 68): one engine start in a
subprocess (vllm_quiet_script.py), also the quick check's vLLM capture (`pytest -m quick`).

Before: 62 lines of vLLM, torch and Python warnings for this script, and its output ended with
vLLM's "force killing remaining process EngineCore" (the exit handler's close failed at exit, so
vLLM's finalizer gave the core 5 s and killed it); `model.info` had no model_id, backend or points
and a 30 kB repr.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from vllm_support import requires_vllm

pytestmark = [pytest.mark.slow, pytest.mark.quick, requires_vllm]

SCRIPT = Path(__file__).with_name("vllm_quiet_script.py")
MAX_LOG_LINES = 5
# What a user's shell has: none of the variables that would change vLLM's logs or ours.
CLEARED = ("IE_VLLM_LOGS", "VLLM_LOGGING_LEVEL", "VLLM_LOGGING_CONFIG_PATH", "IE_PROGRESS",
           "VLLM_CONFIGURE_LOGGING", "TORCH_LOGS", "TORCH_CPP_LOG_LEVEL", "PYTHONWARNINGS")  # fmt: skip


@pytest.fixture(scope="module")
def run() -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # one stream, in the order the lines were written
        text=True,
        timeout=900,
        env=env,
        check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert proc.returncode == 0, "\n".join(lines[-40:])
    info = next(json.loads(line[5:]) for line in lines if line.startswith("INFO "))
    return {"lines": lines, "info": info}


def test_a_plain_script_prints_at_most_five_log_lines_and_ends_with_its_own(
    run: dict[str, Any],
) -> None:
    lines = run["lines"]
    logs = [line for line in lines if not line.startswith(("INFO ", "LAST "))]
    assert len(logs) <= MAX_LOG_LINES, "\n".join(logs)
    assert sum("vLLM engine for" in line and "started in" in line for line in logs) == 1, logs
    assert not any("force killing" in line for line in lines), lines[-10:]
    assert lines[-1] == "LAST (1, 5, 576)", lines[-10:]


def test_model_info_on_vllm_names_the_model_and_its_points(run: dict[str, Any]) -> None:
    info = run["info"]
    assert info["model_id"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert info["backend"] == "vllm"
    assert "resid_post" in info["points"] and "attn_probs" in info["points"]
    assert len(info["repr"]) < 400, info["repr"]
    assert "n_layers=30" in info["repr"] and "d_model=576" in info["repr"]
