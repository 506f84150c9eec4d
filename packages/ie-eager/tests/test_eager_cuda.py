"""ie-eager on a CUDA device against the same checkpoint on the CPU: every point of a synthetic
family equal at fp32 (TF32 off), steering moves the CUDA rows exactly as it moves the CPU ones, and
greedy generation gives the same tokens. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch
from ie_core.ops import Additive, steer_at
from ie_core.protocol import SamplingParams
from ie_core.runner import run
from ie_eager.backend import load
from ie_eager.synthetic import build

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
TOL = 1e-5  # relative to each point's scale: fp32 on both devices, only kernel order differs
FAMILIES = ("llama", "gemma2", "qwen3", "gpt2")
POINT_NAMES = ("resid_pre", "attn_in", "attn_out", "resid_mid", "mlp_in", "mlp_out", "resid_post")


@pytest.fixture(autouse=True)
def _no_tf32() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def _pair(slug: str):  # type: ignore[no-untyped-def]
    folder = str(build(slug))
    return load(folder, device="cpu", dtype="float32"), load(folder, device="cuda", dtype="float32")


@pytest.mark.parametrize("slug", FAMILIES)
def test_every_point_on_cuda_equals_the_cpu(slug: str) -> None:
    cpu, cuda = _pair(slug)
    ids = [[1, 5, 9, 2, 7, 3, 11, 4]]
    names = [p for p in POINT_NAMES if p in cpu.points()]
    addresses = [f"{p}.{layer}" for p in names for layer in range(cpu.n_layers)]
    assert len(names) >= 4
    want = run(cpu.capture(ids, addresses))
    got = run(cuda.capture(ids, addresses))
    worst = max(
        ((got[a].float().cpu() - want[a]).abs().max() / want[a].abs().max().clamp_min(1e-6)).item()
        for a in addresses
    )
    assert worst <= TOL, worst


@pytest.mark.parametrize("slug", ("llama", "gpt2"))
def test_steering_and_greedy_tokens_agree_across_devices(slug: str) -> None:
    cpu, cuda = _pair(slug)
    ids = [1, 5, 9, 2, 7, 3]
    point = "resid_post.1"
    vector = torch.randn(cpu.d_model, generator=torch.Generator().manual_seed(3)).tolist()
    spec = steer_at(point, Additive(vector, coeff=2.0))
    moved = {}
    for name, model in (("cpu", cpu), ("cuda", cuda)):
        plain = run(model.capture(ids, [point]))[point].float().cpu()
        steered = run(model.capture(ids, [point], steering=spec))[point].float().cpu()
        moved[name] = steered - plain
    assert (moved["cpu"].abs().max() - 2.0 * torch.tensor(vector).abs().max()).abs() < 1e-4
    assert (moved["cuda"] - moved["cpu"]).abs().max().item() <= TOL * 10
    tokens = {
        name: run(
            model.generate(ids, SamplingParams(max_new_tokens=8, stop_at_eos=False))
        ).token_ids
        for name, model in (("cpu", cpu), ("cuda", cuda))
    }
    assert tokens["cpu"] == tokens["cuda"]
