"""`ie serve MODEL --backend vllm [any vLLM serve argument]`: vLLM's own OpenAI server, hooked.

This runs `vllm serve` itself (its app, its engine client, its scheduler, `--api-key`,
`--tensor-parallel-size`, `--data-parallel-size`, ...) with ie-vllm's worker extension, so the
`vllm.endpoint_plugins` entry point of ie-vllm adds the `/v1/ie/*` routes and steered OpenAI
requests. Nothing here re-implements a server.
"""

from __future__ import annotations

import argparse
import os
import sys

from ie_core.models import resolve_model_path

from ie_vllm.engine import DEFAULT_CPU_KVCACHE_GIB, WORKER_EXTENSION, on_cpu

BACKENDS = ("vllm", "vllm-generate")
PLUGIN = "interp-engine"
# Groups vLLM loads unless `VLLM_PLUGINS` names a subset: kept as they were when we set it.
OPEN_GROUPS = ("vllm.general_plugins", "vllm.io_processor_plugins", "vllm.stat_logger_plugins")


def plugins_allowlist(current: str | None) -> str:
    """`VLLM_PLUGINS` with ie-vllm's endpoint plugin allowed (vLLM loads endpoint plugins only
    when named there); when unset, every installed plugin of the open groups stays allowed."""
    from importlib.metadata import entry_points

    if current is not None:
        names = [n.strip() for n in current.split(",") if n.strip()]
    else:
        names = [ep.name for group in OPEN_GROUPS for ep in entry_points(group=group)]
    return ",".join(dict.fromkeys([*names, PLUGIN]))


def serve_argv(model: str, backend: str, rest: list[str]) -> list[str]:
    """The `vllm serve` argument list for `ie serve` (exposed for tests and `--dry-run`)."""
    if backend not in BACKENDS:
        raise SystemExit(
            f"ie serve: backend {backend!r} is not served over HTTP yet; use one of "
            f"{', '.join(BACKENDS)} (vllm-static over HTTP is not implemented)"
        )
    path = resolve_model_path(model)
    argv = ["serve", str(path) if path is not None else model]
    argv += ["--worker-extension-cls", WORKER_EXTENSION]
    if "--served-model-name" not in rest:
        argv += ["--served-model-name", model]
    if backend == "vllm" and "--enforce-eager" not in rest:
        argv.append("--enforce-eager")
    if on_cpu() and "--dtype" not in rest:
        argv += ["--dtype", "float32"]
    return argv + rest


def serve_command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="ie serve",
        description="Serve MODEL with vLLM's OpenAI-compatible server plus capture and steering "
        "routes (/v1/ie/*); every argument after the known ones goes to `vllm serve` unchanged.",
    )
    parser.add_argument("model", help="HF id, local folder, ie-synthetic/<family> or SmolLM2's id")
    parser.add_argument("--backend", default="vllm", choices=BACKENDS, help="(default: vllm)")
    parser.add_argument("--dry-run", action="store_true", help="print the vllm command and exit")
    args, rest = parser.parse_known_args(argv)
    vllm_argv = serve_argv(args.model, args.backend, rest)
    if args.dry_run:
        print("vllm " + " ".join(vllm_argv))
        return 0
    if on_cpu():
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", DEFAULT_CPU_KVCACHE_GIB)
    os.environ["VLLM_PLUGINS"] = plugins_allowlist(os.environ.get("VLLM_PLUGINS"))
    os.execv(sys.executable, [sys.executable, "-m", "ie_vllm.serve_main", *vllm_argv])
    return 0  # not reached


__all__ = ["plugins_allowlist", "serve_argv", "serve_command"]
