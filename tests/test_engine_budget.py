"""The engine budget (tests/engine_starts.py): more starts than tests/engine_budget.json allows
fail the whole default run with exit status 1; the budget itself passes. No engine is started:
the starts are fake lines in the record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from engine_starts import BUDGET_FILE, ENV, budget, check_budget, read_starts, summary_lines

pytest_plugins = ["pytester"]

TESTS = Path(__file__).resolve().parent


def fake_start(n: int) -> dict[str, object]:
    return {"model": f"m{n}", "kind": "engine", "hooked": True, "args": {"max_model_len": 64},
            "pid": 1, "seconds": 1.5, "ok": True, "test": None}  # fmt: skip


def test_the_budget_file_holds_a_positive_count() -> None:
    assert json.loads(BUDGET_FILE.read_text()) == {"max_engine_starts": budget()}
    assert budget() > 0


def test_the_check_fails_one_start_over_the_budget_and_passes_the_budget() -> None:
    n = budget()
    assert check_budget(n, n) is None
    message = check_budget(n + 1, n)
    assert message is not None
    assert f"started {n + 1} engines, the budget is {n}" in message


def test_the_record_is_read_after_the_offset_and_summed(tmp_path: Path) -> None:
    log = tmp_path / "starts.jsonl"
    log.write_text(json.dumps(fake_start(0)) + "\n")
    offset = log.stat().st_size
    log.write_text(log.read_text() + "".join(json.dumps(fake_start(i)) + "\n" for i in (1, 2)))
    starts = read_starts(log, offset)
    assert [s["model"] for s in starts] == ["m1", "m2"]
    lines = summary_lines(starts, [(2.0, "smollm2", "module", "a.py"), (0.1, "x", "function", "")])
    assert lines[0] == "2 engine starts, 3.0 s in all:"
    assert "max_model_len=64" in lines[2]
    assert "smollm2 (module)" in lines[6]


def test_the_engine_log_names_the_same_variable() -> None:
    engine_log = pytest.importorskip("ie_vllm.host.engine_log")
    assert engine_log.ENV == ENV


def _run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, starts: int, *args: str):
    """A whole default run (testpaths, no selection) of one test that records `starts` fake
    engine starts where the plugin pointed IE_ENGINE_LOG."""
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.delenv("IE_FULL_SUITE", raising=False)
    monkeypatch.setenv("PYTHONPATH", str(TESTS))
    pytester.makeini("[pytest]\ntestpaths = .\n")
    line = json.dumps(fake_start(0))
    pytester.makepyfile(
        test_fake=f"""
import os

def test_starts():
    with open(os.environ["{ENV}"], "a") as log:
        log.write(({line!r} + "\\n") * {starts})
"""
    )
    return pytester.runpytest_subprocess("-p", "engine_starts", *args)


def test_one_start_over_the_budget_fails_the_run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    n = budget()
    result = _run(pytester, monkeypatch, n + 1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*1 passed*"])
    result.stdout.fnmatch_lines([f"engine budget exceeded: this run started {n + 1} engines, "
                                 f"the budget is {n} *"])  # fmt: skip


def test_the_budget_itself_passes(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    n = budget()
    result = _run(pytester, monkeypatch, n)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines([f"{n} engine starts, *", f"engine budget: within {n} starts"])


def test_a_selected_run_is_not_checked(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    n = budget()
    result = _run(pytester, monkeypatch, n + 1, "-k", "starts")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["engine budget not checked (-k was given): *"])
