"""Every package builds; the ie-core wheel installs and imports in a fresh venv without torch."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = (
    "ie_core",
    "ie_eager",
    "ie_vllm",
    "ie_static",
    "ie_dashboard",
    "ie_bench",
    "ie_validator",
)


def _uv() -> str:
    uv = shutil.which("uv")
    assert uv, "uv must be on PATH (the README's commands use it)"
    return uv


def test_every_package_builds_and_ie_core_imports_without_torch(tmp_path: Path) -> None:
    uv = _uv()
    dist = tmp_path / "dist"
    subprocess.run(
        [uv, "build", "--all-packages", "--wheel", "-o", str(dist)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    wheels = sorted(p.name for p in dist.glob("*.whl"))
    for package in PACKAGES:
        assert any(w.startswith(package + "-") for w in wheels), (package, wheels)

    venv = tmp_path / "venv"
    subprocess.run([uv, "venv", "-q", str(venv)], check=True)
    python = venv / "bin" / "python"
    (core,) = dist.glob("ie_core-*.whl")
    subprocess.run([uv, "pip", "install", "-q", "--python", str(python), str(core)], check=True)
    code = (
        "import importlib.util, ie_core;"
        "assert importlib.util.find_spec('torch') is None, 'torch leaked into the venv';"
        "from ie_core import POINTS, parse_address;"
        "print(len(POINTS), parse_address('resid_post.10'))"
    )
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["38", "resid_post.10"]
    cli = subprocess.run([str(venv / "bin" / "ie")], capture_output=True, text=True, check=True)
    assert "demo  (not installed: ie-eager" in cli.stdout
