"""Engine starts of a test run: the record, the summary and the budget (docs/TESTING.md).

A pytest plugin (the repository's conftest.py loads it, so every run from this clone has it).
At the session's start it points `IE_ENGINE_LOG` at a file under the session's tmp dir (a path
already set is kept; only lines added during the run count), so every engine the run starts,
in-process or in an `ie serve` server a test starts, appends one JSON line there
(`ie_vllm.host.engine_log`). The terminal summary lists those starts, the ten slowest fixture
setups and the total start seconds. On the whole default run (`BUDGET_RULE`) more starts than
`engine_budget.json`'s `max_engine_starts` fail the run: exit status 1 and a red line naming the
count and the budget. Under pytest-xdist the lanes append to the controller's file and send their
fixture setups back; only the controller sums and judges.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Generator, Sequence
from pathlib import Path
from typing import Any

import pytest

ENV = "IE_ENGINE_LOG"  # ie_vllm.host.engine_log.ENV (not imported: no ie-vllm needed here)
BUDGET_FILE = Path(__file__).with_name("engine_budget.json")
BUDGET_RULE = (
    "the budget applies to the whole default run only: no path arguments (pytest collected its "
    "testpaths), no -k, -m, --deselect, --lf or --sw, and IE_FULL_SUITE is not 1"
)
SLOWEST_SETUPS = 10

_log = pytest.StashKey[tuple[Path, int]]()
_setups = pytest.StashKey[list[tuple[float, str, str, str]]]()
_verdict = pytest.StashKey[str | None]()


def read_starts(path: Path, offset: int = 0) -> list[dict[str, Any]]:
    """The starts recorded in `path` after byte `offset` (a torn last line is skipped)."""
    if not path.is_file():
        return []
    with path.open("rb") as f:
        f.seek(offset)
        text = f.read().decode("utf-8", errors="replace")
    starts = []
    for line in text.splitlines():
        try:
            starts.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return starts


def budget() -> int:
    return int(json.loads(BUDGET_FILE.read_text())["max_engine_starts"])


def check_budget(starts: int, max_starts: int) -> str | None:
    """The failure message when the run started more engines than the budget allows, else None."""
    if starts <= max_starts:
        return None
    return (
        f"engine budget exceeded: this run started {starts} engines, the budget is {max_starts} "
        f"(max_engine_starts in tests/engine_budget.json); share an engine between tests (a "
        f"module- or session-scoped fixture) or, if the new engine is needed, raise the budget "
        f"in the same change and say why"
    )


def not_whole_run(config: pytest.Config) -> str | None:
    """Why this run is not the whole default run (None when it is): see `BUDGET_RULE`."""
    if os.environ.get("IE_FULL_SUITE") == "1":
        return "IE_FULL_SUITE=1"
    if config.args_source != pytest.Config.ArgsSource.TESTPATHS:
        return "paths were named"
    option = config.option
    for flag, name in (("keyword", "-k"), ("markexpr", "-m"), ("deselect", "--deselect")):
        if getattr(option, flag, None):
            return f"{name} was given"
    for flag, name in (("lf", "--lf"), ("stepwise", "--sw")):
        if getattr(option, flag, False):
            return f"{name} was given"
    return None


def summary_lines(
    starts: Sequence[dict[str, Any]], setups: Sequence[tuple[float, str, str, str]]
) -> list[str]:
    lines = [f"{len(starts)} engine starts, {sum(s['seconds'] for s in starts):.1f} s in all:"]
    for s in starts:
        hooked = "hooked" if s.get("hooked") else "not hooked"
        failed = "" if s.get("ok", True) else " FAILED"
        args = ", ".join(f"{k}={v}" for k, v in s.get("args", {}).items())
        lines.append(f"  {s['seconds']:7.1f} s  {s['model']}  {s['kind']} ({hooked}){failed}")
        lines.append(f"             args: {args or '-'}; pid {s['pid']}; {s.get('test') or '-'}")
    lines.append(f"the {SLOWEST_SETUPS} slowest fixture setups:")
    for seconds, name, scope, node in sorted(setups, reverse=True)[:SLOWEST_SETUPS]:
        lines.append(f"  {seconds:7.1f} s  {name} ({scope})  {node}")
    return lines


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_setups] = []
    config.stash[_verdict] = None


def _is_lane(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")  # a pytest-xdist worker, not the controller


def pytest_sessionstart(session: pytest.Session) -> None:
    """Before pytest-xdist starts its lanes (its hook runs last), so they inherit the path."""
    config = session.config
    given = os.environ.get(ENV)
    if given:
        path = Path(given)
    else:
        path = config._tmp_path_factory.getbasetemp() / "engine_starts.jsonl"  # tmp_path's root
        os.environ[ENV] = str(path)
    config.stash[_log] = (path, path.stat().st_size if path.is_file() else 0)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(
    fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
) -> Generator[None, Any, Any]:
    started = time.monotonic()
    try:
        return (yield)
    finally:
        seconds = time.monotonic() - started
        node = request.node.nodeid or "(session)"
        request.config.stash[_setups].append((seconds, fixturedef.argname, fixturedef.scope, node))


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """A lane finished: its fixture setups join the controller's (pytest-xdist hook)."""
    output = getattr(node, "workeroutput", {})
    node.config.stash[_setups].extend(tuple(s) for s in output.get("ie_setups", ()))


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Runs inside the terminal reporter's own sessionfinish, before the summary is written; the
    exit status set here is the one pytest returns."""
    config = session.config
    if _is_lane(config):
        config.workeroutput["ie_setups"] = config.stash[_setups]  # type: ignore[attr-defined]
        return
    if _log not in config.stash or not_whole_run(config) is not None:
        return
    path, offset = config.stash[_log]
    verdict = check_budget(len(read_starts(path, offset)), budget())
    config.stash[_verdict] = verdict
    if verdict is not None and session.exitstatus in (
        pytest.ExitCode.OK,
        pytest.ExitCode.NO_TESTS_COLLECTED,
    ):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if _log not in config.stash or _is_lane(config):
        return
    path, offset = config.stash[_log]
    terminalreporter.write_sep("=", f"engine starts ({path})")
    for line in summary_lines(read_starts(path, offset), config.stash[_setups]):
        terminalreporter.write_line(line)
    reason = not_whole_run(config)
    if reason is not None:
        terminalreporter.write_line(f"engine budget not checked ({reason}): {BUDGET_RULE}")
    elif config.stash[_verdict] is not None:
        terminalreporter.write_line(str(config.stash[_verdict]), red=True, bold=True)
    else:
        terminalreporter.write_line(f"engine budget: within {budget()} starts", green=True)
