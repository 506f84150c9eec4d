"""The committed capability answers: reader, verdicts, the `ie points` views, and the wheel."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from ie_core.capabilities import (
    NOT_VERIFIED,
    PointCapability,
    cell,
    load_capabilities,
    parse_capabilities,
    probe,
)
from ie_core.errors import PointUnavailableError
from ie_core.grammar import POINTS, Address
from ie_core.tooling.capability_cli import format_capabilities
from ie_core.tooling.cli import main

ROOT = Path(__file__).resolve().parents[3]


def test_committed_eager_answers_parse_and_round_trip() -> None:
    answers = load_capabilities("eager")
    assert answers is not None and answers.backend == "eager"
    again = parse_capabilities(json.loads(answers.dumps()))
    assert again == answers
    for _family, points in answers.models.values():
        assert set(points) == {p.name for p in POINTS}


def test_cell_verdicts() -> None:
    assert cell("eager", "llama", "resid_post") == "served"
    assert cell("eager", "gpt-neox", "resid_mid").startswith("refused: ")
    assert "parallel" in cell("eager", "gpt-neox", "resid_mid")
    assert cell("eager", "deepseek-v4", "resid_streams") == "served"
    assert cell("eager", "qwen3-next", "attn_gate") == "served"
    # vLLM CPU cannot build it: refused with vLLM's own error, not left unclaimed.
    refused = cell("vllm-static", "deepseek-v4", "resid_streams")
    assert refused.startswith("refused: ") and "cannot run DeepseekV4ForCausalLM" in refused
    # A family no sweep answered claims nothing either way.
    assert cell("vllm-static", "no-such-family", "resid_post") == NOT_VERIFIED
    with pytest.raises(ValueError, match="unknown backend"):
        cell("vllm-generate", "llama", "resid_post")


def test_probe_groups_layer_refusals_and_keeps_partial_service() -> None:
    """A point served on layer 0 only: served, with the other layers' refusal said once."""

    def check(address: Address) -> str:
        if address.name == "router_logits" and address.layer != 0:
            return str(address)
        if address.name == "resid_post":
            return str(address)
        raise PointUnavailableError(f"layer {address.layer} has no {address.name}")

    caps = probe(3, check, lambda _a, _r: True)
    assert caps["router_logits"] == PointCapability(
        True, True, (1, 2), "layer 0: this layer has no router_logits"
    )
    assert caps["resid_post"] == PointCapability(True, True, (0, 1, 2), "")
    assert caps["mlp_out"] == PointCapability(False, False, (), "this layer has no mlp_out")


def test_points_committed_prints_the_answer_without_loading(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["points", "--backend", "eager", "--family", "gpt-neox", "--committed"]) == 0
    out = capsys.readouterr().out
    assert "resid_mid" in out and "runs attention and MLP in parallel" in out
    # DeepSeek-V4 does not run on vLLM 0.32 CPU: the answer quotes vLLM's own error.
    assert main(["points", "--backend", "vllm", "--family", "deepseek-v4", "--committed"]) == 0
    assert "mlp_layer_types entries must be in" in capsys.readouterr().out
    assert "not verified" in format_capabilities("eager", "gpt-oss", None)


def test_wheel_ships_the_answers_and_reads_them_without_torch(tmp_path: Path) -> None:
    uv = shutil.which("uv")
    assert uv
    dist = tmp_path / "dist"
    subprocess.run(
        [uv, "build", "--package", "ie-core", "--wheel", "-o", str(dist)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    venv = tmp_path / "venv"
    subprocess.run([uv, "venv", "-q", str(venv)], check=True)
    (wheel,) = dist.glob("ie_core-*.whl")
    python = venv / "bin" / "python"
    subprocess.run([uv, "pip", "install", "-q", "--python", str(python), str(wheel)], check=True)
    out = subprocess.run(
        [
            str(venv / "bin" / "ie"),
            "points",
            "--backend",
            "eager",
            "--family",
            "llama",
            "--committed",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "resid_post" in out.stdout and "served (layers 0, 1, 2, 3; writable)" in out.stdout


def test_sweep_records_a_refused_checkpoint_as_every_point_refused() -> None:
    from ie_core.errors import UnsupportedModelError
    from ie_core.tooling.capability_sweep import sweep

    why = "vLLM 0.32.0 (CPU) cannot run X from this checkpoint: its engine fails with KeyError"

    def refuse(model_id: str, **_kw: object) -> object:
        raise UnsupportedModelError(why)

    def broken(model_id: str, **_kw: object) -> object:
        raise RuntimeError("engine core initialization failed")

    caps = sweep("vllm", ["x"], refuse, "cmd").models["ie-synthetic/x"][1]
    assert set(caps) == {p.name for p in POINTS}
    assert all(not c.served and not c.writable and c.reason == why for c in caps.values())
    # Negative control: any other load failure is left out (rendered "not verified").
    assert sweep("vllm", ["x"], broken, "cmd").models == {}
