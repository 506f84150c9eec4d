"""vLLM's logs quiet by default (ie_vllm.host.quiet_logs), without an engine: who decides, what
the configuration keeps, and that the engine processes' variables do not outlive the start.
The engine-level check (a plain script: at most five lines) is test_vllm_script.py."""

from __future__ import annotations

import json
import logging
import os

import pytest
from ie_vllm.host import quiet_logs


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quiet_logs, "_configured", False)
    for name in (quiet_logs.ENV, *quiet_logs.VLLM_CHOICES, *quiet_logs.CHILD_ENV):
        monkeypatch.delenv(name, raising=False)


def test_quiet_unless_asked_for_or_configured_through_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    assert quiet_logs.quiet()
    monkeypatch.setenv("IE_VLLM_LOGS", "0")
    assert quiet_logs.quiet()
    monkeypatch.setenv("IE_VLLM_LOGS", "1")
    assert not quiet_logs.quiet()
    monkeypatch.delenv("IE_VLLM_LOGS")
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "INFO")  # the user's own choice wins
    assert not quiet_logs.quiet()


def _record(level: int, message: str) -> logging.LogRecord:
    return logging.LogRecord("vllm.v1.utils", level, __file__, 1, message, None, None)


def test_the_filter_keeps_errors_and_a_forced_kill_only() -> None:
    keep = quiet_logs.KeepTrouble().filter
    assert keep(_record(logging.ERROR, "Engine core failed"))
    assert keep(_record(logging.WARNING, "[shutdown] Process manager: force killing remaining"))
    assert not keep(_record(logging.WARNING, "Enforce eager set, disabling torch.compile"))
    assert not keep(_record(logging.INFO, "Resolved architecture: LlamaForCausalLM"))


def test_configure_quiets_this_process_and_the_start_names_the_file_for_vllm() -> None:
    try:
        quiet_logs.configure()
        vllm = logging.getLogger("vllm")
        assert not vllm.propagate and vllm.level == logging.WARNING
        assert "VLLM_LOGGING_CONFIG_PATH" not in os.environ
        with quiet_logs.engine_processes():
            with open(os.environ["VLLM_LOGGING_CONFIG_PATH"], encoding="utf-8") as file:
                assert json.load(file) == quiet_logs.logging_config()
            assert quiet_logs.quiet()  # still ours while the variable is set
        assert "VLLM_LOGGING_CONFIG_PATH" not in os.environ  # a later `ie serve` logs as usual
    finally:
        logging.getLogger("vllm").handlers.clear()


def test_engine_process_variables_last_for_the_start_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_LOGS", "+dynamo")  # the user's own value stays
    with quiet_logs.engine_processes():
        assert os.environ["TORCH_CPP_LOG_LEVEL"] == "ERROR"
        assert os.environ["PYTHONWARNINGS"] == "ignore::FutureWarning"
        assert os.environ["TORCH_LOGS"] == "+dynamo"
    assert "TORCH_CPP_LOG_LEVEL" not in os.environ and "PYTHONWARNINGS" not in os.environ
    assert os.environ["TORCH_LOGS"] == "+dynamo"
    monkeypatch.setenv("IE_VLLM_LOGS", "1")
    with quiet_logs.engine_processes():
        assert "TORCH_CPP_LOG_LEVEL" not in os.environ


def test_the_start_line_only_when_quiet(capsys: pytest.CaptureFixture[str]) -> None:
    quiet_logs.announce_start("m", 12.34, True)
    assert capsys.readouterr().err == ""
    quiet_logs._configured = True
    quiet_logs.announce_start("m", 12.34, True)
    assert capsys.readouterr().err.startswith("ie: vLLM engine for m started in 12.3 s")
