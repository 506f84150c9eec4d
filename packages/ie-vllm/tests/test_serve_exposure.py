"""`ie serve`'s open defaults (issue 31, finding 7) and its request limits (no engine started)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from ie_vllm.server.http_errors import MAX_MESSAGE, BadRequest, error_body, status_for
from ie_vllm.server.http_limits import Limits, capture_bytes, check_response, check_text, parse_json
from ie_vllm.server.serve_command import exposure_warning, is_loopback, serve_argv

MODEL = "ie-synthetic/llama"


def test_the_server_binds_loopback_unless_a_host_is_given() -> None:
    argv = serve_argv(MODEL, "vllm", ["--port", "9"])
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    argv = serve_argv(MODEL, "vllm", ["--host", "0.0.0.0", "--api-key", "k"])
    assert argv.count("--host") == 1 and argv[argv.index("--host") + 1] == "0.0.0.0"
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3") and not is_loopback("a.b")


def test_an_open_host_without_a_key_is_refused_unless_allowed_and_then_warned() -> None:
    with pytest.raises(SystemExit, match=r"refusing --host 0\.0\.0\.0 without --api-key"):
        exposure_warning(["--host", "0.0.0.0"], {}, allow_open=False)
    warned = exposure_warning(["--host=0.0.0.0"], {}, allow_open=True)
    assert warned is not None and "WARNING" in warned and "anyone" in warned
    local = exposure_warning([], {}, allow_open=False)
    assert local is not None and "no --api-key" in local
    assert exposure_warning(["--host", "0.0.0.0", "--api-key", "k"], {}, False) is None
    assert exposure_warning(["--host", "0.0.0.0"], {"VLLM_API_KEY": "k"}, False) is None


@pytest.mark.full  # two CLI start-ups (torch and vLLM imports): about a minute on 2 cores
def test_the_cli_refuses_before_starting_anything() -> None:
    ie = Path(sys.executable).with_name("ie")
    done = subprocess.run(
        [str(ie), "serve", MODEL, "--host", "0.0.0.0", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0 and "--allow-no-api-key" in done.stderr, done.stderr[-500:]
    done = subprocess.run(
        [str(ie), "serve", MODEL, "--dry-run"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and "--host 127.0.0.1" in done.stdout, done.stderr[-500:]
    assert "WARNING no --api-key" in done.stderr


def test_text_is_bounded_by_bytes_and_answers_by_size() -> None:
    limits = Limits(max_model_len=100, max_token_bytes=8, max_response_bytes=2**20)
    check_text(limits, 800, "p")  # 100 tokens of 8 bytes can hold it
    with pytest.raises(BadRequest, match="refused before tokenizing"):
        check_text(limits, 801, "p")
    # 2 prompts of 10 tokens, a d=16 residual and a 4-head attention pattern, fp32.
    widths = {"resid_post.1": 16, "attn_probs.1": 4}
    got = capture_bytes(widths, ["resid_post.1", "attn_probs.1"], [10, 10])
    assert got == 2 * (10 * 16 * 4 + 10 * 4 * 10 * 4)
    with pytest.raises(BadRequest, match=r"would return 1\.0 MiB") as refused:
        check_response(limits, 2**20 + 1, "x")
    assert refused.value.status == 413


def test_deep_json_and_long_messages_are_bounded() -> None:
    with pytest.raises(BadRequest, match="nested too deeply"):
        parse_json(b"[" * 100_000 + b"]" * 100_000)
    assert status_for(RecursionError("deep")) == 400
    body = error_body(ValueError("x" * 100_000))
    assert len(body["error"]["message"]) < MAX_MESSAGE + 100
