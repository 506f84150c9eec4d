"""The `ie` command: `--version`, one-line errors with exit status 1, the traceback behind --debug."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ie_core
import pytest
from ie_core.errors import ModelNotFoundError
from ie_core.tooling import cli


@dataclass(frozen=True)
class FakeEntryPoint:
    name: str
    target: Any

    def load(self) -> Any:
        return self.target


def _with_command(monkeypatch: pytest.MonkeyPatch, name: str, target: Any) -> None:
    monkeypatch.setattr(cli, "entry_points", lambda group: [FakeEntryPoint(name, target)])


def _raise(exc: Exception) -> Any:
    def command(argv: list[str]) -> int:
        raise exc

    return command


def test_version_lists_the_installed_packages(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--version"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert f"ie-core {ie_core.__version__}" in lines
    assert ie_core.__version__ == "0.1.0"


def test_project_error_is_one_line_and_exit_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    message = "cannot find 'x/y'; pass a local folder"
    _with_command(monkeypatch, "demo", _raise(ModelNotFoundError(message)))
    assert cli.main(["demo"]) == 1
    err = capsys.readouterr().err
    assert err == f"ie demo: ModelNotFoundError: {message}\n"
    assert "Traceback" not in err


def test_unexpected_error_asks_for_debug(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _with_command(monkeypatch, "demo", _raise(RuntimeError("boom\nsecond line")))
    assert cli.main(["demo"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "boom" in err and "--debug" in err


def test_debug_shows_the_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    _with_command(monkeypatch, "demo", _raise(RuntimeError("boom")))
    with pytest.raises(RuntimeError, match="boom"):
        cli.main(["--debug", "demo"])
    monkeypatch.setenv("IE_DEBUG", "1")
    with pytest.raises(RuntimeError, match="boom"):
        cli.main(["demo"])


def test_real_command_bad_backend(capsys: pytest.CaptureFixture[str]) -> None:
    """The real `ie demo` entry point: an unknown backend fails before loading anything."""
    assert cli.main(["demo", "--backend", "bogus", "--model", "ie-synthetic/llama"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown backend 'bogus'" in err[0]


def test_help_names_missing_commands_and_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "entry_points", lambda group: [])
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "bench  (not installed: ie-bench (pip install 'ie-bench[eager]'))" in out
    assert "validate  (not installed: ie-validator (pip install 'ie-validator[peers]'))" in out
    assert "uv sync" not in out
    assert cli.main(["bench"]) == 2
