"""Issue 68: what the docs import from ie_core's submodules is also importable from ie_core
itself (loaded on first use, so `import ie_core` stays free of torch), and the module paths that
moved (`ie_core.patching`, ...) still import, as the same module, with a DeprecationWarning."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import warnings
from pathlib import Path

import ie_core
import pytest
from ie_core.moved import MOVED, REMOVED_IN

ROOT = Path(__file__).resolve().parents[3]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
IMPORT = re.compile(r"from (ie_core(?:\.[\w.]+)?) import (\([^)]*\)|[^\n]+)")
# A name that is also a subpackage of ie_core: `from ie_core import harvest` is the package.
SUBPACKAGE_NAMES = {"harvest", "atlas"}


def doc_imports() -> set[tuple[str, str]]:
    found = set()
    for doc in DOCS:
        for module, names in IMPORT.findall(doc.read_text(encoding="utf-8")):
            for name in re.split(r"[\s,()]+", names.split("#")[0]):
                if name.isidentifier() and name != "as":
                    found.add((module, name))
    return found


def test_the_docs_import_something_from_submodules() -> None:
    modules = {module for module, _ in doc_imports()}
    assert {"ie_core.experiments.patching", "ie_core.circuits"} <= modules


def test_every_name_the_docs_import_is_a_top_level_name() -> None:
    missing = []
    for module, name in sorted(doc_imports()):
        if name in SUBPACKAGE_NAMES:
            continue
        here = getattr(importlib.import_module(module), name)
        try:
            top = getattr(ie_core, name)
        except AttributeError:
            missing.append(f"{module}.{name}")
            continue
        assert top is here, (module, name)
    assert missing == []


def test_the_issue_names_import_from_the_top_and_torch_waits_for_them() -> None:
    code = (
        "import sys, ie_core; assert 'torch' not in sys.modules; "
        "from ie_core import patch_sweep, logit_diff, load_sae, attribute, capture, run_with_cache;"
        "print('ok')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        ie_core.not_a_name  # noqa: B018


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_module_path_imports_the_new_module_with_a_warning(old: str) -> None:
    sys.modules.pop(old, None)
    with pytest.warns(
        DeprecationWarning, match=rf"{re.escape(old)} moved to {MOVED[old]}.*{REMOVED_IN}"
    ):
        module = importlib.import_module(old)
    assert module is importlib.import_module(MOVED[old])


def test_the_warning_points_at_the_importing_line() -> None:
    sys.modules.pop("ie_core.patching", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from ie_core.patching import patch_sweep  # noqa: F401
    assert caught and caught[0].filename == __file__
