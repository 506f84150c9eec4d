"""Suite-wide pytest hooks: tests marked `full` run only when IE_FULL_SUITE=1; engine starts.

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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("IE_FULL_SUITE") == "1":
        return
    skip = pytest.mark.skip(reason="long form only: IE_FULL_SUITE=1 runs it")
    for item in items:
        if "full" in item.keywords:
            item.add_marker(skip)
