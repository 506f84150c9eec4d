"""The browser-install decision: installed when missing and root, else a skip reason naming the
command; never an install attempt where it cannot succeed."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import browser_install
import pytest


def test_present_browser_needs_nothing(tmp_path: Path) -> None:
    chromium = tmp_path / "chromium"
    chromium.touch()
    assert browser_install.ensure_chromium(str(chromium)) is None


def test_non_root_gets_the_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("IE_NO_BROWSER_INSTALL", raising=False)
    monkeypatch.setattr(browser_install.os, "geteuid", lambda: 1000)
    reason = browser_install.ensure_chromium(str(tmp_path / "chromium"))
    assert reason is not None and "apt-get install -y chromium" in reason


def test_root_installs_with_apt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    chromium = tmp_path / "chromium"
    calls: list[list[str]] = []

    def fake_run(command: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        calls.append(command)
        if "install" in command:
            chromium.touch()
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.delenv("IE_NO_BROWSER_INSTALL", raising=False)
    monkeypatch.setattr(browser_install.os, "geteuid", lambda: 0)
    monkeypatch.setattr(browser_install.shutil, "which", lambda name: "/usr/bin/apt-get")
    monkeypatch.setattr(browser_install.subprocess, "run", fake_run)
    assert browser_install.ensure_chromium(str(chromium)) is None
    assert calls == [["apt-get", "update", "-qq"], browser_install.INSTALL]
    # Opting out: no apt call, a reason instead.
    chromium.unlink()
    calls.clear()
    monkeypatch.setenv("IE_NO_BROWSER_INSTALL", "1")
    assert "IE_NO_BROWSER_INSTALL" in (browser_install.ensure_chromium(str(chromium)) or "")
    assert calls == []
