"""Progress bars: off when stderr is not a terminal (logs, CI), forced by IE_PROGRESS either way."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest
from ie_core import progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("IE_PROGRESS", "HF_HUB_DISABLE_PROGRESS_BARS", "TQDM_DISABLE"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_a_log_gets_no_bars_and_a_terminal_keeps_them(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setattr(sys, "stderr", io.StringIO())
    assert not progress.progress_enabled()
    clean_env.setattr(sys, "stderr", Terminal())
    assert progress.progress_enabled()
    assert progress.quiet_third_party_progress() is False
    assert "TQDM_DISABLE" not in os.environ  # a terminal is left alone


@pytest.mark.parametrize(("value", "enabled"), [("1", True), ("0", False), ("off", False)])
def test_the_variable_wins(clean_env: pytest.MonkeyPatch, value: str, enabled: bool) -> None:
    clean_env.setattr(sys, "stderr", io.StringIO() if enabled else Terminal())
    clean_env.setenv("IE_PROGRESS", value)
    assert progress.progress_enabled() is enabled


def test_quieting_reaches_tqdm_in_a_fresh_process() -> None:
    """A process whose stderr is a pipe: after quieting, a plain tqdm bar draws nothing (and the
    user's own setting is kept: TQDM_DISABLE is only set when absent)."""
    code = (
        "from ie_core.progress import quiet_third_party_progress as q; q()\n"
        "from tqdm import tqdm\n"
        "for _ in tqdm(range(3), desc='flood'): pass\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in {"IE_PROGRESS", "TQDM_DISABLE"}}
    quiet = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert quiet.returncode == 0 and "flood" not in quiet.stderr, quiet.stderr
    forced = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "IE_PROGRESS": "1"},
        capture_output=True,
        text=True,
    )
    assert "flood" in forced.stderr  # negative control: the bar is there when forced on
