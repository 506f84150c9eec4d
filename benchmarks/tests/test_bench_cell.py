"""One cell end to end on the fake backend (load_model patched): the JSON it writes is a valid cell."""

from __future__ import annotations

import json
from pathlib import Path

import ie_core.loading
import pytest
from bench_fake_model import FakeModel
from ie_bench.cell import run_cell
from ie_bench.cells import read_cell, schema_errors
from ie_bench.spec import WORKLOADS, get_model, get_profile, get_variant


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **flags: bool) -> dict:
    seen: dict = {}

    def fake_load(model_id: str, backend: str, **kwargs: object) -> FakeModel:
        seen.update(model_id=model_id, backend=backend, kwargs=kwargs)
        return FakeModel(**flags)

    monkeypatch.setattr(ie_core.loading, "load_model", fake_load)
    out = tmp_path / "cell.json"
    cell = run_cell(get_model("fake/model"), get_variant("vllm"), get_profile("tiny"), out)
    assert json.loads(out.read_text()) == cell
    cell["_seen"] = seen
    return cell


def test_cell_records_profile_environment_and_every_workload(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cell = _run(tmp_path, monkeypatch)
    assert cell["status"] == "ok"
    assert schema_errors({k: v for k, v in cell.items() if k != "_seen"}) == []
    assert set(cell["workloads"]) == {w.key for w in WORKLOADS}
    assert cell["profile"]["name"] == "tiny"
    env = cell["environment"]
    assert {"cpu", "memory_gib", "versions", "loadavg_start", "loadavg_end"} <= set(env)
    assert {"torch", "vllm", "transformers", "python", "ie-bench"} <= set(env["versions"])
    assert cell["load"]["dtype_requested"] == "float32"
    assert cell["load"]["dtype_resolved"] == "float32"
    # vLLM variants get prefix caching off and a context that fits the profile.
    assert cell["_seen"]["kwargs"]["enable_prefix_caching"] is False
    assert cell["_seen"]["backend"] == "vllm"


def test_refusing_backend_gives_unsupported_not_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cell = _run(tmp_path, monkeypatch, refuse_capture=True)
    statuses = {k: w["status"] for k, w in cell["workloads"].items()}
    assert statuses["generate"] == "ok"
    assert statuses["capture_all"] == "unsupported"
    assert cell["status"] == "ok"


def test_load_failure_is_recorded_and_every_workload_marked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(model_id: str, backend: str, **kwargs: object) -> FakeModel:
        raise RuntimeError("engine failed to start: out of memory")

    monkeypatch.setattr(ie_core.loading, "load_model", broken)
    out = tmp_path / "cell.json"
    run_cell(get_model("fake/model"), get_variant("eager"), get_profile("tiny"), out)
    cell = read_cell(out)
    assert cell["status"] == "error"
    assert "out of memory" in cell["error"]["message"]
    assert all(w["status"] == "error" for w in cell["workloads"].values())
