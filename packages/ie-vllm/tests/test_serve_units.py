"""`ie serve`'s command line and plugin allowlist (no engine started)."""

from __future__ import annotations

import pytest
from ie_vllm.serve_command import PLUGIN, plugins_allowlist, serve_argv


def test_serve_argv_runs_vllm_serve_hooked_with_the_extension() -> None:
    argv = serve_argv("ie-synthetic/llama", "vllm", ["--port", "9", "--api-key", "k"])
    assert argv[0] == "serve" and argv[1].endswith("llama-v1")
    assert argv[argv.index("--worker-extension-cls") + 1] == "ie_vllm.worker.IEWorkerExtension"
    assert "--enforce-eager" in argv and argv[-4:] == ["--port", "9", "--api-key", "k"]
    assert argv[argv.index("--served-model-name") + 1] == "ie-synthetic/llama"
    assert "--enforce-eager" not in serve_argv("ie-synthetic/llama", "vllm-generate", [])


def test_vllm_static_over_http_is_refused_with_the_reason() -> None:
    with pytest.raises(SystemExit, match="not implemented"):
        serve_argv("ie-synthetic/llama", "vllm-static", [])


def test_the_endpoint_plugin_is_allowlisted_without_dropping_other_plugins() -> None:
    assert plugins_allowlist("a, b") == f"a,b,{PLUGIN}"
    assert plugins_allowlist(f"{PLUGIN}") == PLUGIN
    assert plugins_allowlist(None).split(",")[-1] == PLUGIN
