"""Debian's Chromium for the browser tests, installed on first use where the tests may do so.

`uv run pytest` in a fresh clone should drive the real browser, not skip: when /usr/bin/chromium
is missing, we are root and apt-get exists, the package `chromium` is installed (Debian keeps it
patched; Playwright's own browser download is never used). Anywhere else the reason to skip names
the command to run. `IE_NO_BROWSER_INSTALL=1` turns the install off.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from ie_dashboard.screenshots import CHROMIUM

INSTALL = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "chromium"]
HINT = "install Debian's browser with `sudo apt-get install -y chromium`"


def ensure_chromium(chromium: str = CHROMIUM) -> str | None:
    """None when the browser is there (installing it if allowed), else why the tests skip."""
    if Path(chromium).exists():
        return None
    if os.environ.get("IE_NO_BROWSER_INSTALL", "") not in {"", "0"}:
        return f"{chromium} is missing and IE_NO_BROWSER_INSTALL is set: {HINT}"
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return f"{chromium} is missing and this user cannot apt-get: {HINT}"
    print("installing Debian's chromium for the browser tests (apt-get, once)", file=sys.stderr)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update", "-qq"], INSTALL):
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            return f"`{' '.join(command)}` failed ({tail[0]}): {HINT}"
    return None if Path(chromium).exists() else f"apt-get installed no {chromium}: {HINT}"
