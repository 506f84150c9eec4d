"""The committed mutation report is the rendering of the committed per-package summaries, and
each equivalent mutant it excuses has a reason (scripts/mutation_report.py writes both)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _report_module():
    sys.path.insert(0, str(ROOT / "scripts"))  # it imports mutation_equivalent beside it
    spec = importlib.util.spec_from_file_location(
        "mutation_report", ROOT / "scripts" / "mutation_report.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_report_renders_from_the_committed_summaries() -> None:
    report = _report_module()
    state = json.loads((ROOT / "docs" / "notes" / "mutation.json").read_text())
    assert sorted(state) == ["ie-core", "ie-eager", "ie-static", "ie-vllm"]
    assert report.report(state) == (ROOT / "docs" / "notes" / "mutation.md").read_text()


def test_every_excused_equivalent_mutant_is_listed_with_its_reason() -> None:
    report = _report_module()
    text = (ROOT / "docs" / "notes" / "mutation.md").read_text()
    excused = re.findall(r"^- `(\S+)` [^*]+\*\*equivalent\*\* \((.+?)\): `", text, re.M)
    assert excused
    for name, why in excused:
        assert report.EQUIVALENT[name] == why
    # Negative control: a mutant that is not excused is shown as open, not equivalent.
    assert report.category("not_a_listed_mutant__mutmut_1", ["-    x = 1", "+    x = 2"]) == "open"
