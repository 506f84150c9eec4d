"""vLLM's logs, quiet by default: an engine start prints one line (with its time), and vLLM shows
its errors only; `IE_VLLM_LOGS=1` leaves vLLM's logging exactly as vLLM sets it.

Quiet goes through vLLM's own logging configuration: during an engine start
`VLLM_LOGGING_CONFIG_PATH` names a `dictConfig` file (written here once per process) that vLLM
applies in this process and in every engine process it starts, and the same configuration is
applied here before vLLM is first imported (vLLM's own import logs before it configures anything).
The engine's processes also get torch's log levels at ERROR (`TORCH_LOGS`, `TORCH_CPP_LOG_LEVEL`)
and Python's FutureWarnings off: both come from vLLM's code, not the user's. These variables are
set for the start only, so a process the script starts later (an `ie serve`) logs as usual. A variable the user set is left as
set, and so is vLLM's configuration when `VLLM_LOGGING_LEVEL`, `VLLM_LOGGING_CONFIG_PATH` or
`VLLM_CONFIGURE_LOGGING` is set.

A warning that the shutdown had to kill an engine process still shows: it means the engine did not
stop cleanly.
"""

from __future__ import annotations

import contextlib
import json
import logging
import logging.config
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["ENV", "KeepTrouble", "announce_start", "configure", "engine_processes", "quiet"]

ENV = "IE_VLLM_LOGS"
VLLM_CHOICES = ("VLLM_LOGGING_LEVEL", "VLLM_LOGGING_CONFIG_PATH", "VLLM_CONFIGURE_LOGGING")
# For the engine's processes during the start only (restored after): torch's loggers and its C++
# warnings at ERROR, and vLLM's FutureWarnings about torch APIs off.
CHILD_ENV = {
    "TORCH_LOGS": "-torch",
    "TORCH_CPP_LOG_LEVEL": "ERROR",
    "PYTHONWARNINGS": "ignore::FutureWarning",
}
FORCE_KILL = "force killing"  # vLLM's shutdown: a process that did not exit in time

_configured = False
_config_path: Path | None = None


def quiet() -> bool:
    """Whether vLLM's logs are ours to quiet: not asked for (`IE_VLLM_LOGS=1`) and not configured
    by the user through vLLM's own variables (once `configure` ran, this process stays quiet)."""
    if _configured:
        return True
    if os.environ.get(ENV, "").strip() not in ("", "0"):
        return False
    return not any(name in os.environ for name in VLLM_CHOICES)


class KeepTrouble(logging.Filter):
    """Errors, and the warning that a shutdown had to kill a process; nothing else."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True
        return record.levelno >= logging.WARNING and FORCE_KILL in record.getMessage()


def logging_config() -> dict[str, Any]:
    """The `dictConfig` vLLM applies: its `vllm` logger to stderr through `KeepTrouble`."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"trouble": {"()": f"{__name__}.KeepTrouble"}},
        "formatters": {
            "vllm": {"format": "vLLM %(levelname)s [%(filename)s:%(lineno)d] %(message)s"}
        },
        "handlers": {
            "vllm": {
                "class": "logging.StreamHandler",
                "stream": "ext://sys.stderr",
                "formatter": "vllm",
                "filters": ["trouble"],
            }
        },
        "loggers": {"vllm": {"handlers": ["vllm"], "level": "WARNING", "propagate": False}},
    }


def _config_file() -> Path:
    """The `dictConfig` as a file vLLM can read, written once per process."""
    global _config_path
    if _config_path is None or not _config_path.exists():
        _config_path = Path(tempfile.gettempdir()) / f"ie-vllm-logging-{os.getpid()}.json"
        _config_path.write_text(json.dumps(logging_config()), encoding="utf-8")
    return _config_path


def configure() -> None:
    """Before the first vLLM import of a load: quiet this process's vLLM logs now (vLLM applies
    the same configuration again at each start, `engine_processes`). Once per process."""
    global _configured
    if _configured or not quiet():
        return
    logging.config.dictConfig(logging_config())
    # torch's import-time note on this process ("No CUDA runtime is found"), raised by vLLM's import.
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    _configured = True


@contextlib.contextmanager
def engine_processes() -> Iterator[None]:
    """Around an engine start: the configuration file and `CHILD_ENV` for vLLM and the processes
    it spawns, then the user's own environment again."""
    if not quiet():
        yield
        return
    wanted = {**CHILD_ENV, "VLLM_LOGGING_CONFIG_PATH": str(_config_file())}
    before = {name: os.environ.get(name) for name in wanted}
    for name, value in wanted.items():
        os.environ.setdefault(name, value)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def announce_start(model: str, seconds: float, ok: bool) -> None:
    """The one line of a quiet start (vLLM's own lines say it with `IE_VLLM_LOGS=1`)."""
    if not _configured:
        return
    what = "started" if ok else "failed to start"
    print(
        f"ie: vLLM engine for {model} {what} in {seconds:.1f} s ({ENV}=1 shows vLLM's logs)",
        file=sys.stderr,
        flush=True,
    )
