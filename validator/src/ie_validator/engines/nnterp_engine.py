"""nnterp 1.3 (`StandardizedTransformer`) in its own environment: it needs nnsight 0.7, the
workspace pins 0.8. The validator builds that environment from PyPI and reads the dump from disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from ie_validator.engines.base import Capture, EngineError, ModelSpec, Request, canonical
from ie_validator.mappings import NNTERP_LOAD_KWARGS, Gap
from ie_validator.scoring import Tier

DUMP_SCRIPT = Path(__file__).resolve().parents[1] / "peers" / "nnterp_dump.py"
# nnterp 1.3 imports only beside nnsight 0.7; torch and transformers match the workspace lock.
PINS = ("nnterp==1.3.0", "nnsight==0.7.0", "torch==2.13.0", "transformers==5.19.0", "safetensors")


def env_dir() -> Path:
    """`validator/.venv-nnterp` in a clone, else the user cache; `$IE_NNTERP_ENV` overrides."""
    from ie_validator.layout import layout

    return layout().nnterp_env


def env_python() -> Path:
    return env_dir() / "bin" / "python"


def build_env(*, quiet: bool = False) -> Path:
    """Create (or reuse) the nnterp environment with uv; returns its python."""
    python = env_python()
    env_folder = python.parents[1]
    if python.exists():
        return python
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    try:
        subprocess.run(
            ["uv", "venv", "-q", str(env_folder), "--python", version],
            check=True,
            capture_output=quiet,
        )
        subprocess.run(
            ["uv", "pip", "install", "-q", "--python", str(python), *PINS],
            check=True,
            capture_output=quiet,
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        raise EngineError(
            f"could not build the nnterp environment at {env_folder} with uv ({exc}); "
            "run `ie validate nnterp-env` with network access to PyPI"
        ) from exc
    return python


class NNterpEngine:
    name = "nnterp"
    tier = Tier.RAW_HF

    def capture(self, model: ModelSpec, ids: Sequence[int], requests: Sequence[Request]) -> Capture:
        from safetensors.numpy import load_file

        python = build_env(quiet=True)
        with tempfile.TemporaryDirectory(prefix="ie-nnterp-") as tmp:
            request = Path(tmp) / "request.json"
            dump = Path(tmp) / "dump.safetensors"
            request.write_text(
                json.dumps(
                    {
                        "model": str(model.path),
                        "ids": list(ids),
                        "requests": {r.key: r.hook for r in requests},
                        "kwargs": NNTERP_LOAD_KWARGS.get(model.family, {}),
                    }
                )
            )
            env = {**os.environ, "IE_TORCH_THREADS": os.environ.get("IE_TORCH_THREADS", "1")}
            env.pop("VIRTUAL_ENV", None)
            proc = subprocess.run(
                [str(python), str(DUMP_SCRIPT), str(request), str(dump)],
                capture_output=True,
                text=True,
                env=env,
            )
            if proc.returncode != 0:
                last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
                raise EngineError(f"nnterp could not run this model: {last}", proc.stderr[-4000:])
            meta = json.loads(Path(str(dump) + ".json").read_text())
            arrays = load_file(str(dump))
        self.versions = meta["versions"]
        out: Capture = {}
        for req in requests:
            if req.key in arrays:
                out[req.key] = canonical(req.address.name, arrays[req.key])
            else:
                out[req.key] = Gap(
                    f"nnterp failed on {req.hook}: {meta['errors'].get(req.key, 'no value')}"
                )
        return out
