"""ie-vllm's declared surface: every name in `__all__` resolves, lazily, and the type checkers'
list agrees with the runtime one."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import ie_vllm

INIT = Path(ie_vllm.__file__)


def test_every_public_name_resolves() -> None:
    for name in ie_vllm.__all__:
        assert getattr(ie_vllm, name) is not None, name


def test_runtime_and_type_checking_lists_agree_with_all() -> None:
    tree = ast.parse(INIT.read_text())
    typed = {
        alias.asname
        for node in ast.walk(tree)
        if isinstance(node, ast.If)
        for imp in node.body
        if isinstance(imp, ast.ImportFrom)
        for alias in imp.names
    }
    runtime = set(ie_vllm._EXPORTS) | set(ie_vllm._MODULES)
    assert set(ie_vllm.__all__) == runtime | {"__version__"}
    assert typed == runtime


def test_import_does_not_load_torch_or_vllm() -> None:
    code = "import sys, ie_vllm; print('torch' in sys.modules, 'vllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_an_unknown_name_is_an_attribute_error() -> None:
    # Negative control: the lazy lookup does not invent names.
    try:
        ie_vllm.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("ie_vllm.no_such_name resolved")
