"""The `ie` command as a newcomer meets it: did-you-mean, `ie points` views, whole error advice."""

from __future__ import annotations

import pytest
from ie_core.errors import ModelNotFoundError
from ie_core.tooling import cli
from ie_core.tooling.cli import describe_failure, installed_versions, main


def test_a_misspelt_command_names_the_nearest(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pointz"]) == 2
    assert "did you mean `ie points`?" in capsys.readouterr().err
    assert main(["zzzzzz"]) == 2
    assert "did you mean" not in capsys.readouterr().err  # negative control: nothing near


def test_a_misspelt_flag_names_the_nearest(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["points", "--famly", "llama"])
    assert "(did you mean --family?)" in capsys.readouterr().err


def test_plain_points_is_one_line_per_point(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["points"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) < 45 and sum(line.startswith("resid_post ") for line in lines) == 1
    assert main(["points", "--markdown"]) == 0
    assert "## Names in other engines" in capsys.readouterr().out


def test_family_without_backend_prints_every_backends_committed_answer(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["points", "--family", "gemma2"]) == 0
    out = capsys.readouterr().out
    for backend in ("eager", "vllm", "vllm-static"):
        assert f"gemma2 on {backend} (measured on ie-synthetic/gemma2" in out
    assert "the layer lists are that build's" in out


def test_an_unknown_family_names_the_nearest(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["points", "--family", "gema2"])
    assert "did you mean 'gemma2'?" in capsys.readouterr().err


def test_version_lists_ie_remote() -> None:
    assert "ie-remote" in installed_versions()  # the workspace installs it


def test_a_multi_line_project_error_keeps_its_advice_on_one_line() -> None:
    # transformers' own reason spans lines; the advice after it used to be cut off.
    exc = ModelNotFoundError("cannot find 'gpt2' (We couldn't connect\nto the Hub.); pass a folder")
    line = describe_failure("demo", exc)
    assert line.count("\n") == 0 and line.endswith("to the Hub.); pass a folder")
    assert cli.DEBUG_FLAG not in line
