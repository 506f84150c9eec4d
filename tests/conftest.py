"""Fixtures shared by the repository-level tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from serve_process import LLAMA, LLAMA_CONTEXT, LLAMA_KEY, SAE_NAME, ie_serve, sae_folder


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One `ie serve` of ie-synthetic/llama for every test that needs that server (an engine
    start is minutes on 2 cores); each test leaves it as it found it (nothing registered)."""
    pytest.importorskip("vllm")
    folder = tmp_path_factory.mktemp("llama-server")
    args = ["--api-key", LLAMA_KEY, "--max-model-len", str(LLAMA_CONTEXT)]
    args += ["--disable-uvicorn-access-log", "--sae", f"{SAE_NAME}={sae_folder(folder)}"]
    with ie_serve(LLAMA, args, folder / "server.log") as url:
        yield url
