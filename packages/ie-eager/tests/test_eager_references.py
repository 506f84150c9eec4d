"""Eager against references that share none of its code: each steering op's steered activation
against the float64 definition (ie-core's op_references.py), and KV-cached greedy generation
against greedy decoding by repeated full forwards of the plain HF model, steered by a forward hook
written here, for plain, all-positions, prefill-only and masked scopes.

Tolerances: 1e-5 relative to the activations' scale for one steered forward (fp32); greedy tokens
exactly, and each step's logprob within 1e-4 (KV-cached vs full forward: summation order only)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from eager_support import PROMPT, synthetic_model
from ie_core.experiments.features import feature_clamp
from ie_core.experiments.saes import from_tensors
from ie_core.ops import (
    Additive,
    FeatureClamp,
    LensAblate,
    LensSteer,
    LensSwap,
    Orthogonal,
    Patch,
    PositionMask,
    ProjectionCap,
    Scale,
    SteeringOp,
    steer_at,
)
from ie_core.protocol import SamplingParams
from ie_core.runner import run
from ie_eager.backend import EagerModel

# ie-core's references, imported by path: that folder is on sys.path only when its tests run too.
# Found upward (a mutation run executes this file one folder deeper, from packages/ie-eager/mutants).
sys.path.insert(
    0,
    next(
        str(p / "ie-core/tests")
        for p in Path(__file__).resolve().parents
        if (p / "ie-core").is_dir()
    ),
)
from op_references import reference, sae_clamp_reference

SLUG = "llama"
LAYER = 1


@pytest.fixture(scope="module")
def model() -> EagerModel:
    return synthetic_model(SLUG)


def _vec(model: EagerModel, seed: int) -> torch.Tensor:
    return torch.randn(model.d_model, generator=torch.Generator().manual_seed(seed))


def _ops(model: EagerModel) -> dict[str, SteeringOp]:
    v = lambda seed: _vec(model, seed)  # noqa: E731
    return {
        "additive": Additive(v(0), coeff=0.8),
        "orthogonal": Orthogonal(v(1), coeff=0.25),
        "cap": ProjectionCap(v(2), min=-0.3, max=0.3),
        "lens_steer_below_cap": LensSteer(v(3), strength=0.2, max_fraction=0.6),
        "lens_steer_above_cap": LensSteer(v(3), strength=3.0, max_fraction=0.4),
        "lens_ablate": LensAblate(v(4)),
        "lens_swap": LensSwap(v(5), v(6)),
    }


def _capture(model: EagerModel, address: str, steering: object = None) -> torch.Tensor:
    ids = [model.to_tokens(PROMPT)]
    return model.forward_with_cache(ids, [address], steering=steering)[1][address]


def assert_matches(got: torch.Tensor, want: torch.Tensor) -> None:
    scale = float(want.abs().max())
    err = float((got.double() - want.double()).abs().max())
    assert err <= 1e-5 * max(scale, 1.0), f"max abs error {err:g} at scale {scale:g}"


@pytest.mark.parametrize("address", [f"resid_post.{LAYER}", f"mlp_out.{LAYER}"])
@pytest.mark.parametrize(
    "name",
    [
        "additive",
        "orthogonal",
        "cap",
        "lens_steer_below_cap",
        "lens_steer_above_cap",
        "lens_ablate",
        "lens_swap",
    ],
)
def test_steered_activation_equals_the_definition(
    model: EagerModel, address: str, name: str
) -> None:
    op = _ops(model)[name]
    plain = _capture(model, address)
    steered = _capture(model, address, steer_at(address, op))
    assert_matches(steered, reference(plain, op))
    assert not torch.allclose(steered, plain, atol=1e-3)  # negative control: the op acted


def test_feature_clamp_on_eager_equals_the_whole_dictionary(model: EagerModel) -> None:
    d, width = model.d_model, 48
    g = torch.Generator().manual_seed(7)
    w = {
        "W_enc": torch.randn(d, width, generator=g) / d**0.5,
        "b_enc": torch.randn(width, generator=g) * 0.1,
        "W_dec": torch.randn(width, d, generator=g) / width**0.5,
        "b_dec": torch.randn(d, generator=g) * 0.1,
    }
    address = f"resid_post.{LAYER}"
    sae = from_tensors(w, address=address, activation="relu", b_dec_in=True)
    plain = _capture(model, address)
    pre = (plain - w["b_dec"]) @ w["W_enc"] + w["b_enc"]
    feature = int((pre > 0).float().mean((0, 1)).sub(0.5).abs().argmin())  # active on some rows
    op = feature_clamp(sae, feature, 2.0)
    assert isinstance(op, FeatureClamp)
    steered = _capture(model, address, steer_at(address, op))
    assert_matches(steered, sae_clamp_reference(plain, w, feature, 2.0, b_dec_in=True))


def test_patch_and_scale_on_eager_equal_the_definition(model: EagerModel) -> None:
    address = f"z.{LAYER}"
    plain = _capture(model, address)
    hd = model.structure.shapes.head_dim
    scaled = _capture(model, address, steer_at(address, Scale(-2.0, heads=(1,), head_dim=hd)))
    want = plain.clone()
    want[..., hd : 2 * hd] *= -2.0
    assert torch.equal(scaled, want)
    row = torch.arange(plain.shape[-1], dtype=torch.float32) / 10
    patched = _capture(model, address, steer_at(address, Patch(row, positions=(2, 5))))
    want = plain.clone()
    want[:, [2, 5]] = row
    assert torch.equal(patched, want)
    assert not torch.equal(patched, plain)


# -- greedy generation against full forwards --

STEPS = 6
SAMPLING = SamplingParams(max_new_tokens=STEPS, stop_at_eos=False, logprobs=0)
Rows = Callable[[int, int], torch.Tensor]  # (sequence length, prompt length) -> bool [seq]


def _all_rows(seq: int, prompt: int) -> torch.Tensor:
    return torch.ones(seq, dtype=torch.bool)


def _prefill_rows(seq: int, prompt: int) -> torch.Tensor:
    return torch.arange(seq) < prompt


def _unmasked_last_prompt_row(seq: int, prompt: int) -> torch.Tensor:
    rows = torch.ones(seq, dtype=torch.bool)
    rows[prompt - 1] = False
    return rows


def _full_forward_greedy(
    model: EagerModel, prompt: list[int], vector: torch.Tensor | None, rows: Rows
) -> tuple[list[int], list[float]]:
    """Greedy tokens (and their logprobs) from one full forward of the whole sequence per step,
    with `vector` added to the block output at the rows `rows` selects."""
    hf = model.hf_model
    block = hf.model.layers[LAYER]
    ids = list(prompt)
    tokens: list[int] = []
    logprobs: list[float] = []

    def add(module: torch.nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        assert vector is not None
        mask = rows(output.shape[1], len(prompt)).unsqueeze(-1)
        return output + mask * vector

    handle = block.register_forward_hook(add) if vector is not None else None
    try:
        for _ in range(STEPS):
            with torch.no_grad():
                logits = hf(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1]
            token = int(logits.argmax())
            logprobs.append(float(torch.log_softmax(logits.float(), -1)[token]))
            tokens.append(token)
            ids.append(token)
    finally:
        if handle is not None:
            handle.remove()
    return tokens, logprobs


SCOPES: dict[str, tuple[PositionMask, Rows]] = {
    "all_positions": (PositionMask(), _all_rows),
    "prefill_only": (PositionMask(prefill_only=True), _prefill_rows),
}


def _vector(model: EagerModel) -> torch.Tensor:
    # Large against the synthetic model's residual (norm ~ 10): every scope changes the tokens.
    return _vec(model, 11) * 3.0


@pytest.mark.parametrize("scope", ["plain", "all_positions", "prefill_only", "masked_last"])
def test_kv_cached_greedy_equals_full_forward_greedy(model: EagerModel, scope: str) -> None:
    prompt = model.to_tokens(PROMPT)
    vector = None if scope == "plain" else _vector(model)
    if scope == "masked_last":
        mask, rows = PositionMask((len(prompt) - 1,)), _unmasked_last_prompt_row
    else:
        mask, rows = SCOPES.get(scope, (PositionMask(), _all_rows))
    spec = None if vector is None else steer_at(f"resid_post.{LAYER}", Additive(vector), mask=mask)
    gen = run(model.generate(prompt, SAMPLING, steering=spec))
    want_tokens, want_logprobs = _full_forward_greedy(model, prompt, vector, rows)
    assert list(gen.token_ids) == want_tokens
    assert gen.logprobs is not None
    got = torch.tensor([s.logprob for s in gen.logprobs])
    assert torch.allclose(got, torch.tensor(want_logprobs), atol=1e-4)


def test_scopes_give_different_greedy_tokens(model: EagerModel) -> None:
    """Negative control for the test above: each scope's reference is its own answer."""
    prompt, vector = model.to_tokens(PROMPT), _vector(model)
    answers = {
        "plain": _full_forward_greedy(model, prompt, None, _all_rows)[0],
        "all": _full_forward_greedy(model, prompt, vector, _all_rows)[0],
        "prefill": _full_forward_greedy(model, prompt, vector, _prefill_rows)[0],
        "masked": _full_forward_greedy(model, prompt, vector, _unmasked_last_prompt_row)[0],
    }
    # The scopes differ after the first token (the prefill rows are the same for all three).
    assert len({tuple(a[1:]) for a in answers.values()}) == 4, answers
