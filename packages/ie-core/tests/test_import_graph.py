"""ie-core never imports a backend package: backends plug in through `ie.backends` descriptors."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "ie_core"
BACKEND_PACKAGES = ("ie_eager", "ie_vllm", "ie_static", "ie_remote")


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_no_ie_core_module_imports_a_backend() -> None:
    offenders = {
        str(path.relative_to(SRC)): sorted(
            n for n in _imports(path) if n.split(".")[0] in BACKEND_PACKAGES
        )
        for path in SRC.rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_scan_sees_an_import(tmp_path: Path) -> None:
    """Negative control: the scan reports a backend import when there is one."""
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from ie_eager.synthetic import FAMILIES\n")
    assert "ie_eager.synthetic" in _imports(module)
