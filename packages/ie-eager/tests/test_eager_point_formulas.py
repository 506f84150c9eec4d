"""Every standard family's sub-layer points against hand formulas from the HF model's own
sub-modules and HF's own outputs (`output_hidden_states`, `output_attentions`, logits), not
against other captures of the same hooks: a read taken at the wrong module, layer or position
fails here. Each check has negative controls (the rows shifted one position, the next layer).

Tolerance: 1e-5 absolute and relative (fp32, one backend; only summation order differs)."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from eager_support import FAMILY_SLUGS, PROMPT, synthetic_model
from ie_core.cache import ActivationCache
from ie_eager import structure as st
from ie_eager.backend import EagerModel
from ie_eager.lens import logit_transform
from ie_eager.structure import Block
from torch import nn

TOL = {"atol": 1e-5, "rtol": 1e-5}
POINTS = ("resid_pre", "attn_in", "value", "attn_probs", "resid_mid", "mlp_in", "mlp_pre")
POINTS += ("mlp_out", "resid_post")
# The block's norm before attention, and before the MLP (sequential blocks; a sandwich block's
# post_attention_layernorm is the post-attention norm, so only pre_feedforward_layernorm counts).
PRE_ATTN_NORMS = ("input_layernorm", "ln_1", "self_attn_layer_norm", "ln_attn")
PRE_MLP_NORMS = ("pre_feedforward_layernorm", "ln_2", "final_layer_norm", "ln_mlp")
PRE_MLP_NORMS += ("post_attention_layernorm",)


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.allclose(a.float(), b.float(), **TOL)


def shifted(t: torch.Tensor) -> torch.Tensor:
    """Rows moved one position later (row 0 repeated): what an off-by-one read returns."""
    return torch.cat([t[:, :1], t[:, :-1]], dim=1)


def check(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert close(got, want), f"{what}: max abs error {float((got - want).abs().max()):g}"
    assert not close(shifted(got), want), f"{what}: a shifted read would pass"


@functools.cache
def forward(slug: str) -> tuple[ActivationCache, Any]:
    """(our capture of POINTS at every layer, HF's own outputs) for one prompt."""
    model = synthetic_model(slug)
    ids = [model.to_tokens(PROMPT)]
    addresses = [
        (name, layer)
        for name in POINTS
        for layer in range(model.n_layers)
        if name in model.points() and _serves(model, name, layer)
    ]
    _, cache = model.forward_with_cache(ids, [*addresses, "embeddings", "final_norm", "lm_head"])
    with torch.no_grad():
        out = model.hf_model(
            input_ids=torch.tensor(ids),
            output_hidden_states=True,
            output_attentions=True,
            use_cache=False,
        )
    return cache, out


def _serves(model: EagerModel, name: str, layer: int) -> bool:
    try:
        model.resolve((name, layer))
    except Exception:
        return False
    return True


def _child(block: Block, names: tuple[str, ...]) -> nn.Module | None:
    for name in names:
        module = getattr(block.module, name, None)
        if isinstance(module, nn.Module):
            return module
    return None


def _pre_mlp_norm(block: Block) -> nn.Module | None:
    if block.post_mlp_norm is not None:  # sandwich norms
        return _child(block, ("pre_feedforward_layernorm",))
    norm = _child(block, PRE_MLP_NORMS)
    return norm if norm is not None or not block.parallel else _child(block, PRE_ATTN_NORMS)


@pytest.mark.parametrize("slug", FAMILY_SLUGS)
def test_residual_points_are_hf_hidden_states_and_logits(slug: str) -> None:
    model = synthetic_model(slug)
    cache, out = forward(slug)
    n = model.n_layers
    for layer in range(n):
        check(cache["resid_pre", layer], out.hidden_states[layer], f"resid_pre.{layer}")
        if layer + 1 < n:
            check(cache["resid_post", layer], out.hidden_states[layer + 1], f"resid_post.{layer}")
            assert not close(cache["resid_pre", layer], out.hidden_states[layer + 1])
    check(cache["final_norm"], out.hidden_states[n], "final_norm")
    # lm_head is the unembed's output; the logits add the family's multiplier / softcap.
    logits = logit_transform(model.text_config, cache["lm_head"])
    check(logits, out.logits, "logit_transform(lm_head)")
    embed = model.hf_model.get_input_embeddings()
    ids = torch.tensor([model.to_tokens(PROMPT)])
    check(cache["embeddings"], embed(ids).detach(), "embeddings")


@pytest.mark.parametrize("slug", FAMILY_SLUGS)
def test_attn_probs_are_hf_attentions(slug: str) -> None:
    model = synthetic_model(slug)
    cache, out = forward(slug)
    for layer in range(model.n_layers):
        probs = cache["attn_probs", layer]
        assert close(probs, out.attentions[layer]), f"{slug} attn_probs.{layer}"
        if layer + 1 < model.n_layers:  # negative control: the next layer's map
            assert not close(probs, out.attentions[layer + 1])
        # A map shifted one query row (row 0 repeated) fails too.
        assert not close(torch.cat([probs[:, :, :1], probs[:, :, :-1]], 2), out.attentions[layer])


@pytest.mark.parametrize("slug", FAMILY_SLUGS)
def test_attn_in_is_the_pre_attention_norm_of_resid_pre(slug: str) -> None:
    model = synthetic_model(slug)
    cache, _ = forward(slug)
    for block in model.structure.blocks:
        layer, norm = block.index, _child(block, PRE_ATTN_NORMS)
        resid = cache["resid_pre", layer]
        with torch.no_grad():
            want = resid if norm is None else norm(resid)  # OLMo-2: no norm before attention
        check(cache["attn_in", layer], want, f"{slug} attn_in.{layer}")
        if layer + 1 < model.n_layers and norm is not None:
            assert not close(cache["attn_in", layer + 1], want)  # wrong layer


@pytest.mark.parametrize("slug", FAMILY_SLUGS)
def test_value_is_v_proj_of_attn_in(slug: str) -> None:
    model = synthetic_model(slug)
    cache, _ = forward(slug)
    sh = model.structure.shapes
    blocks = [
        (b, v[1])
        for b in model.structure.blocks
        if (v := b.sub(b.attn, st.V_PROJ_NAMES)) is not None
        and st.out_features(v[1]) == sh.n_kv_heads * sh.head_dim
    ]
    if not blocks:
        pytest.skip(f"{slug}: a fused QKV projection (value's slice: test_eager_invariants.py)")
    for block, v_proj in blocks:
        with torch.no_grad():
            want = v_proj(cache["attn_in", block.index])
        check(cache["value", block.index], want, f"{slug} value.{block.index}")


@pytest.mark.parametrize("slug", FAMILY_SLUGS)
def test_mlp_in_is_the_pre_mlp_norm_of_its_residual(slug: str) -> None:
    model = synthetic_model(slug)
    cache, _ = forward(slug)
    for block in model.structure.blocks:
        layer = block.index
        # Parallel blocks feed the MLP from the block input; sequential ones from resid_mid.
        resid = cache["resid_pre" if block.parallel else "resid_mid", layer]
        norm = _pre_mlp_norm(block)
        with torch.no_grad():
            want = resid if norm is None else norm(resid)
        check(cache["mlp_in", layer], want, f"{slug} mlp_in.{layer}")
        if not block.parallel:  # negative control: the norm of the block input instead
            with torch.no_grad():
                wrong = (
                    cache["resid_pre", layer] if norm is None else norm(cache["resid_pre", layer])
                )
            assert not close(cache["mlp_in", layer], wrong)


@pytest.mark.parametrize("slug", FAMILY_SLUGS)
def test_mlp_out_is_the_mlp_of_mlp_in(slug: str) -> None:
    model = synthetic_model(slug)
    cache, _ = forward(slug)
    checked = 0
    for block in model.structure.blocks:
        if block.mlp is None or block.mlp[1] is block.module or block.attn_adds_residual:
            continue  # OPT's fc1/fc2 sit on the block; BLOOM's MLP adds the residual itself
        with torch.no_grad():
            out = block.mlp[1](cache["mlp_in", block.index])
        out = out[0] if isinstance(out, tuple) else out
        check(cache["mlp_out", block.index], out, f"{slug} mlp_out.{block.index}")
        checked += 1
        first = block.sub(block.mlp, st.GATE_NAMES + st.PLAIN_IN_NAMES)
        if ("mlp_pre", block.index) in cache and first is not None:
            with torch.no_grad():
                pre = first[1](cache["mlp_in", block.index])
            check(cache["mlp_pre", block.index], pre, f"{slug} mlp_pre.{block.index}")
    if not checked:
        pytest.skip(f"{slug}: the MLP is not one module of the block (down projection: invariants)")
