"""`ie serve MODEL --backend vllm [any vLLM serve argument]`: vLLM's own OpenAI server, hooked.

This runs `vllm serve` itself (its app, its engine client, its scheduler, `--api-key`,
`--tensor-parallel-size`, `--data-parallel-size`, ...) with ie-vllm's worker extension, so the
`vllm.endpoint_plugins` entry point of ie-vllm adds the `/v1/ie/*` routes and steered OpenAI
requests. Nothing here re-implements a server.

Unlike `vllm serve`, it binds 127.0.0.1 unless `--host` is given, and refuses a non-loopback
host without an API key unless `--allow-no-api-key` says so (then it warns on every start):
`/v1/ie/capture` hands out the model's activations to whoever can reach the port.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import shlex
import sys
from types import ModuleType

from ie_core.models import resolve_model_path

from ie_vllm.host.cpu_support import on_cpu
from ie_vllm.host.engine import DEFAULT_CPU_KVCACHE_GIB, WORKER_EXTENSION
from ie_vllm.server.http_limits import DEFAULT_RESPONSE_MIB, RESPONSE_ENV
from ie_vllm.server.served_saes import SAES_ENV, parse_sae_args, sae_env
from ie_vllm.worker.runner_adapter import pin_model_runner
from ie_vllm.worker.watchdog import mark_client

BACKENDS = ("vllm", "vllm-generate")
# Other backends served through a module named by an `ie.serve` entry point (ie-static's
# `vllm-static`): `serve_args(model, rest)` adds its vLLM arguments, and the server process
# (told by `BACKEND_ENV`) builds its model with `served_model(engine_client, args)`.
SERVE_GROUP = "ie.serve"
BACKEND_ENV = "IE_SERVE_BACKEND"
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


def _option(rest: list[str], names: tuple[str, ...]) -> str | None:
    for i, arg in enumerate(rest):
        for name in names:
            if arg == name and i + 1 < len(rest):
                return rest[i + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def _int_option(rest: list[str], names: tuple[str, ...], default: int = 1) -> int:
    value = _option(rest, names)
    return default if value is None else int(value)


LOOPBACK = "127.0.0.1"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve to anything


def exposure_warning(rest: list[str], environ: dict[str, str], allow_open: bool) -> str | None:
    """The warning to print for this host and key (None when keyed); refuses an open port.

    Raises SystemExit for a non-loopback host without a key unless `allow_open`."""
    if _option(rest, ("--api-key",)) or environ.get("VLLM_API_KEY"):
        return None
    host = _option(rest, ("--host",)) or LOOPBACK
    if is_loopback(host):
        return (
            f"ie serve: WARNING no --api-key: any process on this machine can generate and read "
            f"activations through {host}; pass --api-key KEY to require one"
        )
    if not allow_open:
        raise SystemExit(
            f"ie serve: refusing --host {host} without --api-key: /v1/ie/capture would hand the "
            "model's activations (and generation) to anyone who reaches the port; pass "
            "--api-key KEY (or VLLM_API_KEY), bind 127.0.0.1, or add --allow-no-api-key"
        )
    return (
        f"ie serve: WARNING --host {host} with no API key (--allow-no-api-key): anyone who "
        "reaches this port can generate, capture and steer"
    )


def cpu_thread_binding(rest: list[str], cpus: list[int]) -> str | None:
    """`VLLM_CPU_OMP_THREADS_BIND` for a CPU server with DP x TP x PP ranks (see
    `parallel_support`)."""
    from ie_vllm.host.parallel_support import cpu_thread_binding as binding

    ranks = _int_option(rest, ("--data-parallel-size", "-dp"))
    ranks *= _int_option(rest, ("--tensor-parallel-size", "-tp"))
    ranks *= _int_option(rest, ("--pipeline-parallel-size", "-pp"))
    return binding(ranks, cpus)


def served_backend(backend: str) -> ModuleType | None:
    """The serving module of an `ie.serve` backend, None for ie-vllm's own backends."""
    from importlib.metadata import entry_points

    if backend in BACKENDS:
        return None
    for ep in entry_points(group=SERVE_GROUP, name=backend):
        module = ep.load()
        assert isinstance(module, ModuleType)
        return module
    hint = " (install ie-static for vllm-static)" if backend == "vllm-static" else ""
    raise SystemExit(
        f"ie serve: backend {backend!r} is not served over HTTP here{hint}; served backends: "
        f"{', '.join(served_backends())}"
    )


def served_backends() -> tuple[str, ...]:
    from importlib.metadata import entry_points

    return (*BACKENDS, *(ep.name for ep in entry_points(group=SERVE_GROUP)))


def refuse_data_parallel(backend: str, rest: list[str]) -> None:
    """Hooked vLLM serves `--data-parallel-size N` behind vLLM's own balancer; another backend,
    or an externally balanced rank, is refused before vLLM starts (`parallel_support`)."""
    from ie_core.errors import UnsupportedOperationError

    from ie_vllm.host.parallel_support import check_data_parallel

    external = any(
        a.startswith(("--data-parallel-rank", "-dpn", "--data-parallel-external-lb")) for a in rest
    )
    kw = {
        "data_parallel_size": _int_option(rest, ("--data-parallel-size", "-dp")),
        "data_parallel_external_lb": external,
    }
    try:
        check_data_parallel(kw, backend)
    except UnsupportedOperationError as exc:
        raise SystemExit(f"ie serve: {exc}") from None


def refuse_pipeline_parallel(backend: str, rest: list[str]) -> None:
    """Hooked vLLM serves pipeline stages; another backend refuses them before vLLM starts, with
    its reason (see `parallel_support`)."""
    from ie_core.errors import UnsupportedOperationError

    from ie_vllm.host.parallel_support import check_pipeline_parallel

    try:
        check_pipeline_parallel(
            {"pipeline_parallel_size": _int_option(rest, ("--pipeline-parallel-size", "-pp"))},
            backend,
        )
    except UnsupportedOperationError as exc:
        raise SystemExit(f"ie serve: {exc}") from None


def refuse_ray_on_cpu(rest: list[str]) -> None:
    """vllm-cpu has no Ray executor (`parallel_support.check_executor`): say so before vLLM
    starts."""
    from ie_core.errors import UnsupportedOperationError

    from ie_vllm.host.parallel_support import check_executor

    try:
        check_executor(
            {"distributed_executor_backend": _option(rest, ("--distributed-executor-backend",))}
        )
    except UnsupportedOperationError as exc:
        raise SystemExit(f"ie serve: {exc}") from None


def refuse_unproven(rest: list[str]) -> list[str]:
    """Async scheduling off, and it or speculative decoding refused, before vLLM starts
    (`engine_args`); returns the flags to add."""
    from ie_core.errors import UnsupportedEngineError

    from ie_vllm.host.engine_args import serve_flags

    try:
        return serve_flags(rest)
    except UnsupportedEngineError as exc:
        raise SystemExit(f"ie serve: {exc}") from None


def serve_argv(model: str, backend: str, rest: list[str]) -> list[str]:
    """The `vllm serve` argument list for `ie serve` (exposed for tests and `--dry-run`)."""
    refuse_data_parallel(backend, rest)
    refuse_ray_on_cpu(rest)
    refuse_pipeline_parallel(backend, rest)
    unproven = refuse_unproven(rest)
    module = served_backend(backend)
    if module is not None:
        rest = module.serve_args(model, rest)
    path = resolve_model_path(model)
    argv = ["serve", str(path) if path is not None else model]
    if _option(rest, ("--host",)) is None:
        argv += ["--host", LOOPBACK]  # vLLM binds every interface by default
    argv += ["--worker-extension-cls", WORKER_EXTENSION]
    if "--served-model-name" not in rest:
        argv += ["--served-model-name", model]
    if backend == "vllm" and "--enforce-eager" not in rest:
        argv.append("--enforce-eager")
    if on_cpu() and "--dtype" not in rest:
        argv += ["--dtype", "float32"]
    return argv + unproven + rest


def serve_command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="ie serve",
        description="Serve MODEL with vLLM's OpenAI-compatible server plus capture and steering "
        "routes (/v1/ie/*); every argument after the known ones goes to `vllm serve` unchanged.",
    )
    parser.add_argument("model", help="HF id, local folder, ie-synthetic/<family> or SmolLM2's id")
    parser.add_argument(
        "--backend", default="vllm", help=f"one of {', '.join(served_backends())} (default: vllm)"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the vllm command and exit")
    parser.add_argument(
        "--allow-no-api-key",
        action="store_true",
        help="serve a non-loopback --host without --api-key (warned on every start)",
    )
    parser.add_argument(
        "--ie-max-response-mib",
        type=float,
        default=DEFAULT_RESPONSE_MIB,
        help="refuse a /v1/ie request whose answer would be larger, computed before running it "
        f"(default: {DEFAULT_RESPONSE_MIB})",
    )
    parser.add_argument(
        "--sae",
        action="append",
        default=[],
        metavar="NAME=SOURCE",
        help="serve a sparse dictionary (SAELens / Gemma Scope / sparsify folder or Hub id) under "
        "NAME for /v1/ie/features and named feature steering; repeatable",
    )
    args, rest = parser.parse_known_args(argv)
    if args.ie_max_response_mib <= 0:
        raise SystemExit("ie serve: --ie-max-response-mib must be positive")
    saes = parse_sae_args(args.sae)
    warning = exposure_warning(rest, dict(os.environ), args.allow_no_api_key)
    vllm_argv = serve_argv(args.model, args.backend, rest)
    if warning is not None:
        print(warning, file=sys.stderr)
    if args.dry_run:
        print(shlex.join(["vllm", *vllm_argv]))
        return 0
    pin_model_runner()  # the worker code runs on vLLM's V1 model runner (runner_adapter)
    if on_cpu():
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", DEFAULT_CPU_KVCACHE_GIB)
        binding = cpu_thread_binding(rest, sorted(os.sched_getaffinity(0)))
        if binding is not None and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = binding
    os.environ["VLLM_PLUGINS"] = plugins_allowlist(os.environ.get("VLLM_PLUGINS"))
    os.environ[BACKEND_ENV] = args.backend
    os.environ[RESPONSE_ENV] = str(args.ie_max_response_mib)
    os.environ[SAES_ENV] = sae_env(saes)
    mark_client()  # the server keeps this pid across execv; its engine processes watch it
    os.execv(sys.executable, [sys.executable, "-m", "ie_vllm.server.serve_main", *vllm_argv])
    return 0  # not reached


__all__ = [
    "BACKEND_ENV",
    "cpu_thread_binding",
    "exposure_warning",
    "is_loopback",
    "plugins_allowlist",
    "refuse_data_parallel",
    "refuse_pipeline_parallel",
    "refuse_ray_on_cpu",
    "refuse_unproven",
    "serve_argv",
    "serve_command",
    "served_backend",
    "served_backends",
]
