"""The README's "Install today" lines work as written: wheels built with `uv build --all-packages`,
installed with `--find-links` into a fresh venv outside the checkout (ie-core: no torch, cheap)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _today_lines() -> tuple[list[str], list[str]]:
    text = (ROOT / "README.md").read_text()
    block = text.split("**Install today.**", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    build = next(line for line in block.splitlines() if line.startswith("uv build"))
    pip = next(line for line in block.splitlines() if line.startswith("pip install"))
    return shlex.split(build), shlex.split(pip.split("#", 1)[0])


def test_install_today_lines_work(tmp_path: Path) -> None:
    uv = shutil.which("uv")
    assert uv
    build, pip = _today_lines()
    assert build[:3] == ["uv", "build", "--all-packages"] and "--find-links" in pip
    dist = tmp_path / "dist"
    build = [uv, *build[1:]]
    build[build.index("dist")] = str(dist)
    subprocess.run(build, cwd=ROOT, check=True, capture_output=True)
    assert len(list(dist.glob("ie_*.whl"))) >= 8  # every package of the README's table
    venv = tmp_path / "venv"
    subprocess.run([uv, "venv", "-q", str(venv)], cwd=tmp_path, check=True)
    # `pip install ARGS` as `uv pip install --python VENV ARGS` (a uv venv has no pip).
    args = [str(dist) if a == "dist" else a for a in pip[2:]]
    install = [uv, "pip", "install", "-q", "--python", str(venv / "bin" / "python"), *args]
    subprocess.run(install, cwd=tmp_path, check=True, capture_output=True)
    out = subprocess.run(
        [str(venv / "bin" / "ie"), "--version"], cwd=tmp_path, capture_output=True, text=True
    )
    assert out.returncode == 0 and re.match(r"ie-core \d", out.stdout), out.stderr
