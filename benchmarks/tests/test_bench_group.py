"""The interleaved sweep on the fake backend: round-robin order, one load per engine, load per cell."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import ie_core.loading
import pytest
from bench_fake_model import FakeModel
from ie_bench.cells import read_cell, schema_errors
from ie_bench.group import Step, round_robin, run_group
from ie_bench.publish import PublishRefused, publish
from ie_bench.spec import get_model, get_profile, get_variant
from ie_core.tooling import load_sampling
from ie_core.tooling.benchmark_load import judge

VARIANTS = ("eager", "vllm", "vllm-eager")  # no mid-stack site: the fake model has no config


def test_round_robin_runs_each_repeat_as_a_round_over_variants() -> None:
    order = round_robin(["a", "b"], ["generate", "steer"], warmup=1, repeats=2)
    assert [(s.workload, s.variant, s.repeat, s.warmup) for s in order] == [
        ("generate", "a", 0, True), ("generate", "b", 0, True),
        ("generate", "a", 0, False), ("generate", "b", 0, False),
        ("generate", "a", 1, False), ("generate", "b", 1, False),
        ("steer", "a", 0, True), ("steer", "b", 0, True),
        ("steer", "a", 0, False), ("steer", "b", 0, False),
        ("steer", "a", 1, False), ("steer", "b", 1, False),
    ]  # fmt: skip
    assert round_robin(["a"], ["generate"], warmup=0, repeats=1) == [
        Step("generate", "a", 0, False)
    ]


class _Logged(FakeModel):
    """A fake model that logs which backend served each streamed generate call."""

    def __init__(self, backend: str, log: list[str]) -> None:
        super().__init__()
        self.backend = backend
        self._log = log

    async def generate_stream(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        self._log.append(self.backend)
        async for chunk in super().generate_stream(*args, **kwargs):
            yield chunk


def _group(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    load: float,
    foreign: int | None = None,
    settle_s: float = 0.0,
) -> tuple[list, dict]:
    served: list[str] = []
    loads: dict[str, int] = {}

    def fake_load(model_id: str, backend: str, **kwargs: object) -> FakeModel:
        loads[backend] = loads.get(backend, 0) + 1
        return _Logged(backend, served)

    monkeypatch.setattr(ie_core.loading, "load_model", fake_load)
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    # The machine this runs on is not idle: other processes are what the fake says.
    monkeypatch.setattr(load_sampling, "foreign_runnable", lambda root: foreign)
    profile = dataclasses.replace(get_profile("tiny"), repeats=3, warmup=1, settle_s=settle_s)
    variants = [get_variant(v) for v in VARIANTS]
    cells = run_group(get_model("fake/model"), variants, profile, tmp_path, ["generate", "steer"])
    return cells, {"served": served, "loads": loads}


def test_group_interleaves_variants_loads_each_engine_once_and_records_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cells, seen = _group(tmp_path, monkeypatch, load=0.25, foreign=0)
    backends = [get_variant(v).backend for v in VARIANTS]
    # One warm-up round and three timed rounds of `generate`, each over every variant in turn.
    assert seen["served"] == backends * 4
    assert seen["loads"] == {b: backends.count(b) for b in backends}  # once per variant
    for cell in cells:
        assert schema_errors(cell) == []
        assert read_cell(tmp_path / "tiny" / f"{cell['cell_id']}.json") == cell
        assert cell["status"] == "ok", cell["workloads"]
        assert len(cell["workloads"]["generate"]["samples"]["decode_tok_s"]) == 3
        env = cell["environment"]
        assert env["schedule"] == {"kind": "round-robin", "variants": list(VARIANTS)}
        assert env["loadavg_start"][0] == env["loadavg_end"][0] == 0.25
        assert env["loadavg_during"]["max_1m"] == 0.25
        assert env["loadavg_during"]["foreign_mean"] == 0
        assert env["loadavg_steps"] == [0.25] * 8  # two workloads, one warm-up + three repeats
    assert judge(cells).passed  # negative control for the refusal below


def test_group_lets_the_previous_engine_go_idle_before_each_timed_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ie_bench.group

    slept: list[float] = []
    monkeypatch.setattr(ie_bench.group, "sleep", slept.append)
    _group(tmp_path, monkeypatch, load=0.25, foreign=0, settle_s=0.5)
    # Two workloads x three timed rounds x three variants; warm-ups run back to back.
    assert slept == [0.5] * 18


def test_gate_refuses_an_interleaved_sweep_run_under_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cells, _ = _group(tmp_path / "cells", monkeypatch, load=9.0, foreign=3)
    verdict = judge(cells)
    assert not verdict.passed
    assert any("3.00 threads of other processes" in r for r in verdict.reasons)
    readme = tmp_path / "README.md"
    readme.write_text("unchanged\n")
    with pytest.raises(PublishRefused, match="fails the publish gate"):
        publish(cells, readme, None)
    assert readme.read_text() == "unchanged\n"


def test_an_engine_that_fails_to_load_leaves_the_others_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fake_load(model_id: str, backend: str, **kwargs: object) -> FakeModel:
        if backend == "vllm":
            raise RuntimeError("engine failed to start: out of memory")
        return FakeModel()

    monkeypatch.setattr(ie_core.loading, "load_model", fake_load)
    variants = [get_variant(v) for v in VARIANTS]
    cells = run_group(
        get_model("fake/model"), variants, get_profile("tiny"), tmp_path, ["generate"]
    )
    status = {c["variant"]["key"]: c["status"] for c in cells}
    assert status == {"eager": "ok", "vllm": "error", "vllm-eager": "ok"}
    failed = next(c for c in cells if c["variant"]["key"] == "vllm")
    assert "out of memory" in failed["error"]["message"]
    assert failed["workloads"]["generate"]["status"] == "error"
