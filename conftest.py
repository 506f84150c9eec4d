"""Suite-wide pytest hooks: tests marked `full` run only when IE_FULL_SUITE=1; engine starts;
the two lanes (pytest-xdist) and which tests must share one.

CI runs one engine per structural case; the long form adds the remaining families and engine
controls (their answers are also committed by the sweeps, and drift-checked without an engine)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

# The engine-start record, summary and budget (tests/engine_starts.py, docs/TESTING.md), loaded
# here because pytest always loads this file (tests/conftest.py only when a run collects tests/).
_spec = importlib.util.spec_from_file_location(
    "engine_starts", Path(__file__).with_name("tests") / "engine_starts.py"
)
assert _spec is not None and _spec.loader is not None
sys.modules["engine_starts"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sys.modules["engine_starts"])


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(sys.modules["engine_starts"], "engine_starts")
    if hasattr(config, "workerinput"):
        # Two lanes share two cores: one compute thread each, so neither waits on the other's
        # spinning OpenMP threads (vLLM's workers set their own threads from their core binding).
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(1)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """`-m quick` (the install check) imports only the test files that mention the marker:
    importing every test module (torch, vLLM, the dashboard's stack) took longer than the check."""
    if config.getoption("markexpr", "") != "quick" or collection_path.suffix != ".py":
        return None
    if not collection_path.name.startswith("test_"):
        return None
    return "quick" not in collection_path.read_text(encoding="utf-8", errors="replace")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Each test module, with every module that uses the same session fixture (one `ie serve`,
    # one PostgreSQL server), runs on one lane, so a shared engine starts once in the run.
    if hasattr(config, "workerinput") and config.getoption("loadgroup", False):
        for item, group in _lane_groups(items).items():
            _join_group(item, group)
    if os.environ.get("IE_FULL_SUITE") == "1":
        return
    skip = pytest.mark.skip(reason="long form only: IE_FULL_SUITE=1 runs it")
    for item in items:
        if "full" in item.keywords:
            item.add_marker(skip)


def _lane_groups(items: list[pytest.Item]) -> dict[pytest.Item, str]:
    """Each test's lane group: its module, merged with every module that shares a session-scoped
    fixture of this repository's conftests (pytest's and plugins' own have no base id)."""
    parent: dict[str, str] = {}

    def root(key: str) -> str:
        while parent.setdefault(key, key) != key:
            key = parent[key]
        return key

    for item in items:
        module = root(item.nodeid.split("::")[0])
        info = getattr(item, "_fixtureinfo", None)
        for name in item.fixturenames if info is not None else ():
            defs = info.name2fixturedefs.get(name) or ()
            if defs and defs[-1].scope == "session" and defs[-1].baseid:
                parent[module] = module = root(f"session fixture {name}")
    return {item: root(item.nodeid.split("::")[0]) for item in items}


def _join_group(item: pytest.Item, group: str) -> None:
    """pytest-xdist's `loadgroup` schedules by the `@group` suffix of a test's id. Its own
    `xdist_group` mark writes `item._nodeid`, which pytest 9.2 no longer reads (`nodeid` is
    `str(item._id)`), so the suffix is written where this pytest reads it."""
    grouped = f"{item.nodeid}@{group}"
    if isinstance(getattr(item, "_id", None), str) or not hasattr(item, "_id"):
        item._nodeid = grouped  # type: ignore[attr-defined]  # pytest before 9.2
    else:
        item._id = type(item._id).parse(grouped)  # type: ignore[attr-defined]
