"""Report and publish rendering from fixture cells (no engine, no measurement)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from bench_fixtures import make_cell, sweep_cells, variant_of
from ie_bench.cells import schema_errors
from ie_bench.publish import (
    END,
    START,
    MarkersMissing,
    PublishRefused,
    drift,
    figures,
    publish,
    render_block,
    splice,
)
from ie_bench.report import render_report
from ie_bench.tables import rounded, rounded_multiplier
from ie_core.tooling.benchmark_load import judge
from ie_core.tooling.load_sampling import LoadSampler, foreign_runnable


def test_fixture_cells_match_the_schema() -> None:
    for cell in sweep_cells():
        assert schema_errors(cell) == []


def test_schema_names_what_is_wrong() -> None:
    cell = sweep_cells()[0]
    cell["workloads"]["generate"]["status"] = "fine"
    del cell["profile"]
    assert any("profile" in e for e in schema_errors(cell))


def test_multipliers_come_from_unrounded_figures() -> None:
    data = figures(sweep_cells())
    entry = data["rows"][0]["tables"]["generate"]["vllm"]
    # 25.4 / 10.4 = 2.44 -> "2.4x"; the printed 25 / 10 would say 2.5x.
    assert entry["multiplier"] == pytest.approx(25.4 / 10.4)
    assert rounded(25.4) == "25" and rounded(10.4) == "10"
    block = render_block(sweep_cells())
    assert "25 (2.4x)" in block
    assert "(2.5x)" not in block


def test_rounding_rules() -> None:
    assert rounded(1238.4) == "1,238"
    assert rounded(9.94) == "9.9"
    assert rounded(0.456) == "0.46"
    assert rounded_multiplier(127.3) == "127x"
    assert rounded_multiplier(14.04) == "14.0x"


def test_block_shows_missing_and_unsupported_distinctly() -> None:
    block = render_block(sweep_cells())
    assert "Measured on Test CPU (2 cores, CPU), float32, 128-token prompt, 32 new tokens" in block
    lines = [line for line in block.splitlines() if line.startswith("| `smollm2-135m`")]
    one_stream, concurrent = lines
    assert "| --" in one_stream  # vllm-static's generate errored: not measured
    assert "300 (29x)" in concurrent  # 300 / 10.2
    assert "8 concurrent requests" in block


def test_report_has_every_section() -> None:
    text = render_report(sweep_cells())
    for heading in ("## Environment", "## Models", "## Variants", "## Steering overhead",
                    "## Unsupported (what came back)", "## What failed", "## Reproduce"):  # fmt: skip
        assert heading in text
    assert "higher is better" in text and "lower is better" in text
    assert "Profile `cpu`" in text
    assert "+25.0%" in text  # steer 1.25 s against capture_gen 1.0 s
    assert "vllm-generate cannot capture" in text
    assert "engine died" in text
    assert "uv run ie bench sweep --profile cpu --models smollm2-135m" in text


@pytest.mark.parametrize(
    ("field", "change"),
    [
        ("dtype", lambda c: c["load"].update(dtype_resolved="bfloat16")),
        (
            "device",
            lambda c: (
                c["environment"].update(gpu={"name": "NVIDIA H200", "memory_gib": 139}),
                c["load"].update(device="cuda"),
            ),
        ),
    ],
)
def test_publish_refuses_mixed_conditions(field: str, change) -> None:
    cells = sweep_cells()
    odd = variant_of(cells, "vllm")
    change(odd)
    cells = [c for c in cells if c["variant"]["key"] != "vllm"] + [odd]
    with pytest.raises(PublishRefused, match=f"disagree on {field}"):
        render_block(cells)


def test_publish_writes_between_markers_and_check_sees_drift(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"# title\n\nbefore\n\n{START}\nold\n{END}\n\nafter\n")
    json_path = tmp_path / "throughput.json"
    cells = sweep_cells()
    assert drift(cells, readme, json_path)
    assert publish(cells, readme, json_path) == [readme, json_path]
    text = readme.read_text()
    assert text.startswith("# title\n\nbefore\n\n") and text.endswith("\n\nafter\n")
    assert "old" not in text
    assert drift(cells, readme, json_path) == []
    assert publish(cells, readme, json_path) == []  # idempotent
    readme.write_text(text.replace("25 (2.4x)", "26 (2.5x)"))
    assert len(drift(cells, readme, json_path)) == 1


def test_splice_refuses_a_file_without_markers() -> None:
    with pytest.raises(MarkersMissing):
        splice("# no markers here\n", "block")


def test_publish_refuses_when_nothing_loaded() -> None:
    cell = make_cell("smollm2-135m", "eager", decode=1.0, aggregate=1.0)
    del cell["load"]["load_s"]
    with pytest.raises(PublishRefused, match="no cell loaded"):
        render_block([cell])


def test_publish_gate_refuses_a_mixed_load_sweep(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"{START}\n{END}\n")
    json_path = tmp_path / "throughput.json"
    clean = sweep_cells()
    # Negative control: the clean sweep passes the gate and publishes with no warning.
    assert judge(clean).passed
    assert publish(clean, readme, json_path) == [readme, json_path]
    assert "Not a headline" not in readme.read_text()
    assert json.loads(json_path.read_text())["gate"]["passed"] is True

    loaded = sweep_cells()
    loaded[0]["environment"]["loadavg_during"] = {"max_1m": 7.5, "min_1m": 3.0, "samples": 9}
    verdict = judge(loaded)
    assert not verdict.passed
    assert any("smollm2-135m__eager ran at 1-minute load 7.50" in r for r in verdict.reasons)
    assert any("different loads" in r for r in verdict.reasons)
    with pytest.raises(PublishRefused, match="fails the publish gate"):
        publish(loaded, readme, json_path)
    assert "Not a headline" not in readme.read_text()  # nothing was written

    publish(loaded, readme, json_path, allow_loaded=True)
    assert "**Not a headline: measured under load**" in readme.read_text()
    assert json.loads(json_path.read_text())["gate"]["passed"] is False
    assert "Not a headline" in render_report(loaded)


def test_publish_gate_catches_a_spread_within_the_bound() -> None:
    cells = sweep_cells()
    for cell, load in zip(cells, (0.2, 0.3, 1.9, 0.4), strict=True):
        cell["environment"]["loadavg_during"] = {"max_1m": load, "min_1m": 0.1, "samples": 5}
    verdict = judge(cells)
    assert not verdict.passed and len(verdict.reasons) == 1
    assert "0.20 to 1.90" in verdict.reasons[0]


def test_a_cell_without_load_cannot_pass_the_gate() -> None:
    cells = sweep_cells()
    del cells[2]["environment"]["loadavg"]
    assert "recorded no load average" in judge(cells).reasons[0]


def test_load_sampler_records_during_the_cell() -> None:
    # Each sample also walks /proc, which on a loaded machine can take longer than the interval:
    # wait for two samples (bounded) rather than a fixed 50 ms.
    with LoadSampler(every_s=0.01) as sampler:
        deadline = time.monotonic() + 10.0
        while sampler.summary()["samples"] < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    summary = sampler.summary()
    assert summary["samples"] >= 2 and summary["max_1m"] >= summary["min_1m"] >= 0


def test_the_gate_judges_other_work_not_the_benchmarks_own_load() -> None:
    """An interleaved group's own engines push the load average past one per core on an idle
    machine (2.2 on 2 cores, measured); where the cells counted other processes' runnable
    threads, that count decides."""
    cells = sweep_cells()
    for cell in cells:
        cell["environment"]["loadavg_during"] = {
            "max_1m": 2.2, "min_1m": 1.3, "samples": 99, "foreign_mean": 0.04, "foreign_max": 1,
        }  # fmt: skip
    assert judge(cells).passed
    # Negative control: the same cells while another job kept most of a core busy.
    cells[1]["environment"]["loadavg_during"]["foreign_mean"] = 0.8
    verdict = judge(cells)
    assert not verdict.passed and len(verdict.reasons) == 1
    assert "shared the machine" in verdict.reasons[0] and "0.80" in verdict.reasons[0]


def _fake_task(proc: Path, pid: int, ppid: int, states: str, comm: str = "x") -> None:
    (proc / str(pid)).mkdir()
    (proc / str(pid) / "stat").write_text(f"{pid} ({comm}) {states[0]} {ppid} 0 0\n")
    for i, state in enumerate(states):
        task = proc / str(pid) / "task" / str(pid * 100 + i)
        task.mkdir(parents=True)
        (task / "stat").write_text(f"{pid} ({comm}) {state} {ppid} 0 0\n")


def test_foreign_runnable_counts_threads_outside_the_benchmarks_tree(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "self").mkdir()
    _fake_task(proc, 10, 1, "RR")  # the benchmark client: ours
    _fake_task(proc, 11, 10, "R")  # its engine core: ours
    _fake_task(proc, 12, 11, "RS")  # the engine's worker: ours
    _fake_task(proc, 20, 1, "RSR", comm="other job) R 10")  # another job (tricky name)
    _fake_task(proc, 21, 20, "S")
    assert foreign_runnable(10, proc) == 2
    assert foreign_runnable(20, proc) == 4  # negative control: from the other side
    assert foreign_runnable(10, tmp_path / "absent") is None


def test_a_workloads_run_would_not_silently_drop_a_cells_other_workloads(tmp_path: Path) -> None:
    from ie_bench.cells import cell_path, write_cell
    from ie_bench.spec import get_model, get_profile, get_variant
    from ie_bench.sweep import dropped_workloads

    profile, model, variant = get_profile("cpu"), get_model("smollm2-135m"), get_variant("vllm")
    cell = make_cell("smollm2-135m", "vllm", decode=10.0, aggregate=40.0)
    path = cell_path(tmp_path, profile.name, model.key, variant.key)
    write_cell(path, cell)
    held = sorted(cell["workloads"])
    assert len(held) > 1
    lost = dropped_workloads(tmp_path, profile, [model], [variant], [held[0]])
    assert lost == {path: held[1:]}
    # Negative controls: every workload it holds, all workloads, or no cell yet: nothing lost.
    assert dropped_workloads(tmp_path, profile, [model], [variant], held) == {}
    assert dropped_workloads(tmp_path, profile, [model], [variant], None) == {}
    assert dropped_workloads(tmp_path / "empty", profile, [model], [variant], [held[0]]) == {}


def test_a_written_cell_is_readable_by_others_and_reads_back(tmp_path: Path) -> None:
    from ie_bench.cells import read_cell, write_cell

    cell = make_cell("smollm2-135m", "vllm", decode=10.0, aggregate=40.0)
    path = tmp_path / "cpu" / "cell.json"
    write_cell(path, cell)
    assert path.stat().st_mode & 0o777 == 0o644  # mkstemp's 0600 would hide it from others
    assert read_cell(path) == cell
