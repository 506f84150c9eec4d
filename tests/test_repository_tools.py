"""ie-bench and ie-validator are repository tools: inside a clone they run, outside one they
refuse in one line naming what to do, before writing anything."""

from __future__ import annotations

from pathlib import Path

import pytest
from ie_bench import cli as bench_cli
from ie_validator import cli as validator_cli


def test_inside_the_checkout_they_run() -> None:
    assert bench_cli.outside_checkout() is None
    assert validator_cli.outside_checkout() is None


def test_outside_a_checkout_they_refuse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(bench_cli, "BENCH_DIR", tmp_path / "site-packages" / "benchmarks")
    monkeypatch.setattr(validator_cli, "VALIDATOR_DIR", tmp_path / "site-packages")
    assert bench_cli.bench_command(["list"]) == 2
    assert validator_cli.validate_command(["render"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2
    for line in err:
        assert "not inside a clone of interp-engine" in line and "uv sync" in line
    assert list(tmp_path.iterdir()) == []
