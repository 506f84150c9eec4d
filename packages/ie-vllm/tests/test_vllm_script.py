"""The sync API from a plain script, an exit without shutdown() stopping the engine cleanly and
quietly (TP=1: at most five log lines, its own last line, `model.info` filled) and shutdown reaping
the engine's processes (TP=2 on CPU, one core per rank: same rows and
streaming-lens top-k as TP=1, sharded points refused)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from vllm_support import requires_vllm

pytestmark = [pytest.mark.slow, requires_vllm]

SCRIPT = Path(__file__).with_name("vllm_script_check.py")
MODEL = "ie-synthetic/llama"


MAX_LOG_LINES = 5  # issue 68: a plain script printed 62 lines of vLLM, torch and Python warnings
# What a user's shell has: none of the variables that change vLLM's logs or ours.
CLEARED = ("IE_VLLM_LOGS", "VLLM_LOGGING_LEVEL", "VLLM_LOGGING_CONFIG_PATH", "IE_PROGRESS",
           "VLLM_CONFIGURE_LOGGING", "TORCH_LOGS", "TORCH_CPP_LOG_LEVEL", "PYTHONWARNINGS")  # fmt: skip


def _run(tp: int, *mode: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    env["VLLM_CPU_KVCACHE_SPACE"] = "1"
    if tp > 1:
        env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(i) for i in range(tp))
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), MODEL, str(tp), *mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # one stream, in the order the lines were written
        text=True,
        timeout=900,
        env=env,
        check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    results = [line for line in lines if line.startswith("RESULT ")]
    assert proc.returncode == 0 and results, proc.stdout[-4000:]
    result = json.loads(results[-1].removeprefix("RESULT "))
    result["output"] = proc.stdout
    result["lines"] = lines
    return result


@pytest.fixture(scope="module")
def tp1() -> dict[str, Any]:
    return _run(1, "exit")


@pytest.mark.quick  # the install check's vLLM capture: this module's one engine start
def test_a_plain_script_prints_at_most_five_log_lines_and_ends_with_its_own(
    tp1: dict[str, Any],
) -> None:
    """Issue 68: before, 62 lines for a plain SmolLM2 script (its config, thread binding, weight
    loading, torch's and Python's warnings) and its output ended with vLLM's "force killing
    remaining process EngineCore" (the exit handler's close failed at exit, so vLLM's finalizer
    gave the core 5 s and killed it). Now one line for the start, vLLM's errors only."""
    lines = tp1["lines"]
    logs = [line for line in lines if not line.startswith("RESULT ")]
    assert len(logs) <= MAX_LOG_LINES, "\n".join(logs)
    assert sum("vLLM engine for" in line and "started in" in line for line in logs) == 1, logs
    assert not any("force killing" in line for line in lines), lines[-10:]
    assert lines[-1].startswith("RESULT "), lines[-10:]


def test_model_info_on_vllm_names_the_model_and_its_points(tp1: dict[str, Any]) -> None:
    """Issue 68: `model.info` had model_id='', backend='', points=() and a 30 kB repr."""
    info = tp1["info"]
    assert (info["model_id"], info["backend"]) == (MODEL, "vllm")
    assert {"resid_post", "attn_probs", "z"} <= set(info["points"])
    assert len(info["repr"]) < 400 and "n_layers=" in info["repr"], info["repr"]


def test_a_script_that_never_calls_shutdown_exits_cleanly(tp1: dict[str, Any]) -> None:
    """Without the exit handler (ie_vllm.host.exit_cleanup) the engine core died under vLLM's
    output loop and the script's last lines were an `EngineDeadError` traceback."""
    assert len(tp1["tokens"]) == 4
    assert tp1["engine_pids"], "the engine should have run in child processes"
    alive = [
        pid
        for pid in tp1["engine_pids"]
        if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    ]
    assert alive == []
    assert "EngineDeadError" not in tp1["output"] and "Traceback" not in tp1["output"]
    assert all(reason == "" for reason in tp1["refused"].values())


@pytest.mark.full  # tests/test_serve_tp2.py runs TP=2 in CI
def test_tensor_parallel_2_matches_tp1_and_refuses_sharded_points(tp1: dict[str, Any]) -> None:
    if (os.cpu_count() or 1) < 2:
        pytest.skip("TP=2 on CPU needs two cores")
    tp2 = _run(2)
    assert tp2["left"] == []
    assert tp2["tokens"] == tp1["tokens"]
    for key, rows in tp1["rows"].items():
        diff = (torch.tensor(tp2["rows"][key]) - torch.tensor(rows)).abs().max()
        assert diff <= 1e-4, (key, float(diff))
    for address, lens in tp1["lens"].items():  # rows from rank 0, top-k over the gathered vocab
        assert tp2["lens"][address]["ids"] == lens["ids"], address
        for got, want in zip(tp2["lens"][address]["probs"], lens["probs"], strict=True):
            diff = float((torch.tensor(got) - torch.tensor(want)).abs().max())
            assert diff <= 1e-4, (address, diff)
    for address, reason in tp2["refused"].items():
        assert "tensor_parallel_size=2" in reason, (address, reason)
