"""ie-bench and ie-validator read and write a folder the user chose (`--root`, an environment
variable, or the working directory), never their installed package: inside a clone they use its
committed layout, elsewhere the folder itself."""

from __future__ import annotations

from pathlib import Path

import pytest
from ie_bench import cli as bench_cli
from ie_bench import layout as bench_layout
from ie_validator import cli as validator_cli
from ie_validator import layout as validator_layout
from ie_validator.results import ValidatorResult, write_result

ROOT = Path(__file__).resolve().parents[1]


def test_inside_a_clone_they_use_its_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT / "packages")  # any folder of the checkout finds it
    monkeypatch.delenv(bench_layout.ROOT_ENV, raising=False)
    monkeypatch.delenv(validator_layout.ROOT_ENV, raising=False)
    monkeypatch.delenv(validator_layout.NNTERP_ENV, raising=False)
    bench = bench_layout.layout()
    assert bench.clone == ROOT and bench.cells_dir == ROOT / "benchmarks" / "cells"
    assert bench.readme == ROOT / "README.md"
    validator = validator_layout.layout()
    assert validator.results == ROOT / "validator" / "results"
    assert validator.matrix_md == ROOT / "validator" / "README.md"
    assert validator.nnterp_env == ROOT / "validator" / ".venv-nnterp"


def test_outside_a_clone_they_use_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(validator_layout.NNTERP_ENV, raising=False)
    for env in (bench_layout.ROOT_ENV, validator_layout.ROOT_ENV):
        monkeypatch.setenv(env, str(tmp_path / "from-env"))
    bench = bench_layout.layout()
    assert bench.clone is None and bench.readme is None
    assert bench.cells_dir == tmp_path / "from-env" / "cells"
    validator = validator_layout.layout(tmp_path / "given")  # an explicit root beats the variable
    assert validator.results == tmp_path / "given" / "results"
    assert validator.matrix_md == tmp_path / "given" / "validation.md"
    assert validator.mappings_doc is None
    assert validator.nnterp_env.is_relative_to(tmp_path / "cache")


def _result(hf_id: str) -> ValidatorResult:
    return ValidatorResult.model_validate(dict(
        hf_id=hf_id, engine="nnsight", reference="eager", verdict="pass", status="ok",
        captured_at="2026-01-01T00:00:00+00:00", dtype="float32", device="cpu", family="llama",
        architecture="LlamaForCausalLM", tier="raw_hf", prompt="p", token_ids=[1], layers=[0],
        versions={}, summary={"pass": 1, "warn": 0, "fail": 0, "n/a": 0},
    ))  # fmt: skip


def test_validator_renders_a_results_folder_outside_a_clone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(validator_layout.ROOT_ENV, raising=False)
    write_result(_result("ie-synthetic/llama"))  # default root: the working directory
    assert validator_cli.validate_command(["render"]) == 0
    matrix = (tmp_path / "validation.md").read_text()
    assert "[ie-synthetic/llama](models/ie-synthetic__llama.md)" in matrix
    assert (tmp_path / "models" / "ie-synthetic__llama.md").is_file()
    assert validator_cli.validate_command(["mappings", "--check"]) == 2
    assert "--doc" in capsys.readouterr().err


def test_validator_names_the_extra_for_a_missing_peer(monkeypatch: pytest.MonkeyPatch) -> None:
    from ie_core.errors import BackendNotInstalledError

    monkeypatch.setattr(validator_cli.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(BackendNotInstalledError, match=r"ie-validator\[nnsight\]"):
        validator_cli.check_engines(["nnsight"])
    with pytest.raises(BackendNotInstalledError, match=r"ie-validator\[transformer-lens\]"):
        validator_cli.check_engines(["transformer-lens"])


def test_bench_report_outside_a_clone_skips_the_readme(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(bench_layout.ROOT_ENV, raising=False)
    assert bench_cli.bench_command(["report", "--no-publish"]) == 1
    assert f"no cells under {tmp_path / 'cells'}" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # nothing written when there is nothing to report


def test_help_shows_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench_cli.bench_command(["sweep", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: 600.0)" in text and "ROOT/cells" in text


def test_dashboard_seeds_from_a_folder_the_tools_wrote(tmp_path: Path) -> None:
    """`ie dashboard seed --root DIR` on a working directory of `ie bench` / `ie validate`."""
    import shutil

    from ie_dashboard.config import database_url
    from ie_dashboard.db import Database
    from ie_dashboard.seed import seed

    cell = next((ROOT / "benchmarks" / "cells").rglob("*.json"))
    (tmp_path / "cells" / "cpu").mkdir(parents=True)
    shutil.copy(cell, tmp_path / "cells" / "cpu" / cell.name)
    result = next((ROOT / "validator" / "results").glob("*/nnsight.json"))
    (tmp_path / "results" / result.parent.name).mkdir(parents=True)
    shutil.copy(result, tmp_path / "results" / result.parent.name / result.name)
    db = Database(database_url(tmp_path / "dash.sqlite"))
    report = seed(db, tmp_path)
    db.dispose()
    assert (report.cells, report.results, report.errors) == (1, 1, [])
