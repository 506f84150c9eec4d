"""Start `ie serve` on a loopback port for a test module, and stop it (its whole process group);
the shared ie-synthetic/llama server's settings and the SAE it serves."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import psutil
import pytest
import torch

START_TIMEOUT_S = 1200

# The server tests/conftest.py shares between the HTTP and hostile-client tests: fp32 on the CPU
# engine, an API key, the model's whole context, one SAE (a local SAELens folder: no Hub here).
LLAMA, LLAMA_KEY, LLAMA_CONTEXT = "ie-synthetic/llama", "ie-test-key", 512
SAE_NAME, SAE_POINT, SAE_WIDTH = "res1", "resid_post.1", 96


def sae_weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(26)
    d = 128  # ie-synthetic/llama's d_model
    return {"W_enc": torch.randn(d, SAE_WIDTH, generator=g) / d**0.5,
            "b_enc": torch.randn(SAE_WIDTH, generator=g) / 8,
            "W_dec": torch.randn(SAE_WIDTH, d, generator=g) / 4,
            "b_dec": torch.randn(d, generator=g) / 8}  # fmt: skip


def sae_folder(folder: Path) -> Path:
    """A SAELens folder (weights and cfg.json) the server loads with --sae."""
    from safetensors.torch import save_file

    save_file(sae_weights(), str(folder / "sae_weights.safetensors"))
    cfg = {"hook_name": "blocks.1.hook_resid_post", "apply_b_dec_to_input": True}
    (folder / "cfg.json").write_text(json.dumps(cfg))
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def ie_serve(model: str, args: Sequence[str], log: Path) -> Iterator[str]:
    """The server's base URL once `/health` answers; its log goes to `log`."""
    port = free_port()
    ie = Path(sys.executable).with_name("ie")
    cmd = [str(ie), "serve", model, "--host", "127.0.0.1", "--port", str(port), *args]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"ie serve exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() - started > START_TIMEOUT_S:
                pytest.fail(f"ie serve did not answer /health in {START_TIMEOUT_S} s")
            time.sleep(2)
        print(f"ie serve ready in {time.monotonic() - started:.1f} s")
        yield url
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def engine_process(server: str, name: str = "EngineCore") -> psutil.Process:
    """The engine process whose title contains `name` (`EngineCore_DP1`: replica 1) under the
    `ie serve` listening at this URL."""
    port = server.rsplit(":", 1)[1]
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "serve" in cmd and "--port" in cmd and cmd[cmd.index("--port") + 1] == port:
            for child in proc.children(recursive=True):
                if name in " ".join(child.cmdline()):
                    return child
    raise AssertionError(f"no {name} process under the server on port {port}")
