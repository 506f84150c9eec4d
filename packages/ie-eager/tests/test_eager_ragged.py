"""Ragged batches on eager: capture_ragged rows equal one-prompt captures; gradients opt-in."""

from __future__ import annotations

import pytest
import torch
from eager_support import synthetic_model
from ie_core import capture, decode_residuals
from ie_core.errors import BadPromptError
from ie_core.experiments.ragged import PaddedCache, capture_ragged
from ie_core.sync import SyncModel

TOL = 1e-5
PROMPTS = ["The capital of France is", "Hi", "One two three four five six seven eight", "Yes"]
ADDRESSES = ["resid_post.1", "attn_probs.0", "mlp_out.0"]


@pytest.mark.parametrize("slug", ["llama", "gpt2", "gemma2"])
def test_ragged_rows_equal_one_prompt_captures(slug: str) -> None:
    model = SyncModel(synthetic_model(slug))
    cache = capture_ragged(model, PROMPTS, ADDRESSES)
    assert isinstance(cache, PaddedCache)
    lengths = [len(model.to_tokens(p)) for p in PROMPTS]
    assert cache.lengths == tuple(lengths)
    longest = max(lengths)
    assert cache["resid_post.1"].shape[:2] == (4, longest)
    assert cache["attn_probs.0"].shape[-2:] == (longest, longest)
    assert cache.mask().sum(1).tolist() == lengths
    worst = 0.0
    for i, prompt in enumerate(PROMPTS):
        alone = model.capture(prompt, ADDRESSES)
        for a in ADDRESSES:
            worst = max(worst, float((cache.unpadded(a)[i] - alone[a][0]).abs().max()))
        assert not cache["resid_post.1"][i, lengths[i] :].any()
    assert worst < TOL


def test_left_padding_would_not_match() -> None:
    """Negative control: one forward over a left-padded prompt moves its rows (positions shift),
    which is why capture_ragged never puts padding into a forward."""
    model = SyncModel(synthetic_model("llama"))
    short = model.to_tokens("Hi")
    alone = model.capture([short], ["resid_post.1"])["resid_post.1"][0]
    padded = model.capture([[0, 0, 0, *short]], ["resid_post.1"])["resid_post.1"][0, 3:]
    assert float((padded - alone).abs().max()) > 100 * TOL


def test_plain_capture_still_refuses_ragged_and_names_the_helper() -> None:
    model = SyncModel(synthetic_model("llama"))
    with pytest.raises(BadPromptError, match="capture_ragged"):
        model.capture([[1, 2, 3], [1, 2]], ["resid_post.0"])
    with pytest.raises(BadPromptError):
        capture_ragged(model, "one string", ["resid_post.0"])


def test_decode_residuals_grad_is_opt_in() -> None:
    model = synthetic_model("llama")
    rows = capture(model, "Hello world", ["resid_post.1"], grad=True)["resid_post.1"][0]
    assert rows.requires_grad
    assert not decode_residuals(model, rows).requires_grad  # default: no graph
    logits = decode_residuals(model, rows, grad=True)
    logits[-1].logsumexp(-1).backward()
    leaf = torch.randn(3, model.d_model, requires_grad=True)
    out = decode_residuals(model, leaf, grad=True)
    (grad,) = torch.autograd.grad(out[:, 5].sum(), leaf)
    # Against a finite difference of the same lens (fp32; step 1e-2 on rows of norm ~1).
    bump = torch.zeros_like(leaf)
    bump[0, 0] = 1e-2
    with torch.no_grad():
        fd = (
            decode_residuals(model, leaf + bump)[0, 5] - decode_residuals(model, leaf - bump)[0, 5]
        ) / 2e-2
    assert abs(float(grad[0, 0]) - float(fd)) < 1e-2 * max(1.0, abs(float(fd)))
