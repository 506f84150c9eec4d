"""Multi-token answers (teacher-forced log-probabilities) and ragged clean / corrupt pairs
(`align=`) in `patch_sweep`, on the synthetic llama (fp32, CPU), each against a plain HF forward
of its `hf_model` with a forward pre-hook written here and a log-softmax by hand."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from eager_support import synthetic_model
from ie_core.errors import BadPromptError, SteeringSpecError
from ie_core.experiments.patching import (
    Metric,
    answer_prob,
    final_logits,
    logit_diff,
    patch_sweep,
)
from ie_core.ops import Patch, PositionMask, Steering
from ie_core.runner import run
from ie_eager.backend import EagerModel

CLEAN = "The capital of France is"
CORRUPT = "The capital of Peru is"  # the same token count on the synthetic tokenizer
LONG = "The old capital of France is"  # four tokens more than SHORT, the same last token
SHORT = "The capital of Spain is"
TOL = 1e-4  # relative, fp32: one model, another batch height and sequence length


@pytest.fixture(scope="module")
def model() -> EagerModel:
    return synthetic_model("llama")


# -- the reference: HF forwards with a hand-written pre-hook and a hand-written log-softmax --------


def _hidden(args: tuple, kwargs: dict) -> torch.Tensor:
    return kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]


def _hf_logits(
    model: EagerModel, ids: list[int], layer: int | None = None, pos: int = 0, row: Any = None
) -> torch.Tensor:
    """[seq, vocab] logits of `ids`, with layer `layer`'s input row `pos` set to `row`."""
    block = model.hf_model.model.layers[layer or 0]

    def pre(_m: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        h = _hidden(args, kwargs).clone()
        h[:, pos] = row
        if "hidden_states" in kwargs:
            return args, {**kwargs, "hidden_states": h}
        return (h, *args[1:]), kwargs

    handle = block.register_forward_pre_hook(pre, with_kwargs=True) if layer is not None else None
    try:
        with torch.no_grad():
            return model.hf_model(torch.tensor([ids])).logits[0].float()
    finally:
        if handle is not None:
            handle.remove()


def _hf_block_inputs(model: EagerModel, ids: list[int]) -> list[torch.Tensor]:
    seen: dict[int, torch.Tensor] = {}
    handles = [
        blk.register_forward_pre_hook(
            lambda _m, a, k, i=i: seen.__setitem__(i, _hidden(a, k)[0].detach().clone()),
            with_kwargs=True,
        )
        for i, blk in enumerate(model.hf_model.model.layers)
    ]
    try:
        with torch.no_grad():
            model.hf_model(torch.tensor([ids]))
    finally:
        for h in handles:
            h.remove()
    return [seen[i] for i in range(len(seen))]


def _logprob(
    model: EagerModel, prompt: list[int], answer: list[int], shift: int = 0, **patch: Any
) -> float:
    """sum_j log p(answer_j | prompt, answer_<j), the softmax by hand; `shift` reads the logits
    that many positions early (a wrong teacher-forcing implementation, for negative controls)."""
    logits = _hf_logits(model, prompt + answer[:-1], **patch)
    total = 0.0
    for j, token in enumerate(answer):
        row = logits[len(prompt) - 1 + j - shift]
        total += float(row[token] - (row - row.max()).exp().sum().log() - row.max())
    return total


def _tokens(model: EagerModel, text: str) -> list[int]:
    return list(model.to_tokens(text, prepend_bos=False))


# -- multi-token answers ---------------------------------------------------------------------------


def test_multi_token_logit_diff_is_the_difference_of_teacher_forced_logprobs(
    model: EagerModel,
) -> None:
    clean, corrupt = model.to_tokens(CLEAN), model.to_tokens(CORRUPT)
    assert len(clean) == len(corrupt)
    paris, madrid = _tokens(model, " Paris"), _tokens(model, " Madrid")
    assert len(paris) > 1 and len(madrid) > 1 and paris[:-1] != madrid[:-1]
    r = patch_sweep(model, CLEAN, CORRUPT, metric=logit_diff(" Paris", " Madrid"))
    source = _hf_block_inputs(model, clean)

    def cell(layer: int, p: int, shift: int = 0) -> float:
        patch = {"layer": layer, "pos": p, "row": source[layer][p]}
        return _logprob(model, corrupt, paris, shift, **patch) - _logprob(
            model, corrupt, madrid, shift, **patch
        )

    want = torch.tensor([[cell(layer, p) for p in range(len(corrupt))] for layer in range(4)])
    assert r.values.shape == (4, len(corrupt)) and r.sources == tuple(range(len(corrupt)))
    assert (r.values - want).abs().max() <= TOL * want.abs().max()
    assert r.clean == pytest.approx(
        _logprob(model, clean, paris) - _logprob(model, clean, madrid), rel=TOL
    )
    assert r.corrupt == pytest.approx(
        _logprob(model, corrupt, paris) - _logprob(model, corrupt, madrid), rel=TOL
    )
    assert (want - r.corrupt).abs().max() > 1e-2  # patching moved the metric
    # Negative controls: teacher forcing read one position early, and a patch one position off.
    assert abs(cell(1, 3, shift=1) - float(r.values[1, 3])) > 1e-2
    off = _logprob(model, corrupt, paris, layer=1, pos=4, row=source[1][3]) - _logprob(
        model, corrupt, madrid, layer=1, pos=4, row=source[1][3]
    )
    assert abs(off - float(r.values[1, 3])) > 1e-2


def test_multi_token_answer_prob_and_a_one_token_answer_beside_a_long_one(
    model: EagerModel,
) -> None:
    clean, corrupt = model.to_tokens(CLEAN), model.to_tokens(CORRUPT)
    paris = _tokens(model, " Paris")
    source = _hf_block_inputs(model, clean)
    prob = patch_sweep(model, CLEAN, CORRUPT, metric=answer_prob(" Paris"), layers=(0, 2))
    want = torch.tensor(
        [
            [
                torch.tensor(
                    _logprob(model, corrupt, paris, layer=layer, pos=p, row=source[layer][p])
                ).exp()
                for p in range(len(corrupt))
            ]
            for layer in (0, 2)
        ]
    )
    assert (prob.values - want).abs().max() <= TOL * want.abs().max()
    # A one-token answer (an id) beside a multi-token one contributes its log-probability.
    mixed = patch_sweep(
        model, CLEAN, CORRUPT, metric=logit_diff(paris, 300), layers=(2,), positions=(1, 5)
    )
    want_mixed = [
        _logprob(model, corrupt, paris, layer=2, pos=p, row=source[2][p])
        - _logprob(model, corrupt, [300], layer=2, pos=p, row=source[2][p])
        for p in (1, 5)
    ]
    assert mixed.cols == (1, 5)
    torch.testing.assert_close(mixed.values[0], torch.tensor(want_mixed), rtol=TOL, atol=TOL)


def test_a_custom_metric_without_seq_fn_refuses_a_multi_token_answer(model: EagerModel) -> None:
    metric = Metric("mine", lambda logits, ids: logits[:, ids[0]], (" Paris",))
    with pytest.raises(SteeringSpecError, match="multi-token answers"):
        patch_sweep(model, CLEAN, CORRUPT, metric=metric, layers=(0,))
    with_seq = Metric("mine", metric.fn, (" Paris",), seq_fn=lambda lp: lp[:, 0])
    r = patch_sweep(model, CLEAN, CORRUPT, metric=with_seq, layers=(0,), positions=(2,))
    assert r.corrupt == pytest.approx(
        _logprob(model, model.to_tokens(CORRUPT), _tokens(model, " Paris")), rel=TOL
    )


# -- single-token answers on equal lengths: unchanged ----------------------------------------------


def test_single_token_equal_length_sweep_is_the_old_computation(model: EagerModel) -> None:
    """The sweep's cells start at their patched position on the prefix's KV cache
    (`ie_eager.prefix_cells`); the old computation runs every cell from position 0 and reads full
    logits. The same numbers up to fp32 rounding (1e-5 of their scale), not bit for bit."""
    clean, corrupt = model.to_tokens(CLEAN), model.to_tokens(CORRUPT)
    metric = logit_diff(300, 277)
    r = patch_sweep(model, CLEAN, CORRUPT, metric=metric)
    # The computation before align= and multi-token answers, written out.
    addresses = [f"resid_pre.{layer}" for layer in range(4)]
    source = run(model.capture([clean], addresses))
    steerings: list[Steering | None] = [None, None]
    for layer in range(4):
        for p in range(len(corrupt)):
            op = Patch.from_cache(source, f"resid_pre.{layer}", (p,))
            steerings.append(Steering("resid_pre", (layer,), (op,), PositionMask()))
    logits = run(final_logits(model, [clean] + [corrupt] * (len(steerings) - 1), steerings))
    old = logits[:, 300] - logits[:, 277]
    scale = max(1.0, float(old.abs().max()))
    assert float((r.values - old[2:].reshape(4, len(corrupt))).abs().max()) <= 1e-5 * scale
    assert abs(r.clean - float(old[0])) <= 1e-5 * scale
    assert abs(r.corrupt - float(old[1])) <= 1e-5 * scale
    assert float((old[2:] - old[1]).abs().max()) > 1e-2  # the patches moved the metric
    # And it is a logit difference (not a log-prob difference), as an HF forward gives it.
    hf = _hf_logits(model, corrupt, 2, 3, _hf_block_inputs(model, clean)[2][3])[-1]
    assert float(r.values[2, 3]) == pytest.approx(float(hf[300] - hf[277]), rel=TOL)


# -- ragged clean / corrupt pairs ------------------------------------------------------------------


def test_ragged_prompts_are_refused_by_default_naming_align(model: EagerModel) -> None:
    n_long, n_short = len(model.to_tokens(LONG)), len(model.to_tokens(SHORT))
    assert n_long != n_short
    with pytest.raises(BadPromptError, match=f'{n_long} and {n_short} tokens.*align="end"'):
        patch_sweep(model, LONG, SHORT, metric=logit_diff(300, 277))


def test_align_end_pairs_positions_from_the_end(model: EagerModel) -> None:
    clean, corrupt = model.to_tokens(LONG), model.to_tokens(SHORT)
    gap = len(clean) - len(corrupt)
    assert gap > 0 and clean[-1] == corrupt[-1]
    r = patch_sweep(model, LONG, SHORT, metric=logit_diff(300, 277), align="end")
    assert r.cols == tuple(range(len(corrupt)))
    assert r.sources == tuple(p + gap for p in range(len(corrupt)))
    source = _hf_block_inputs(model, clean)

    def cell(layer: int, p: int, src: int) -> float:
        last = _hf_logits(model, corrupt, layer, p, source[layer][src])[-1]
        return float(last[300] - last[277])

    want = torch.tensor(
        [[cell(layer, p, p + gap) for p in range(len(corrupt))] for layer in range(4)]
    )
    assert (r.values - want).abs().max() <= TOL * want.abs().max()
    # Negative control: an alignment off by one (gap - 1) gives other values.
    wrong = torch.tensor([cell(layer, 1, gap) for layer in range(4)])
    assert (wrong - r.values[:, 1]).abs().max() > 1e-2
    # The same pairs given as a list give the same sweep; align="start" pairs other rows.
    pairs = [(p + gap, p) for p in range(len(corrupt))]
    listed = patch_sweep(model, LONG, SHORT, metric=logit_diff(300, 277), align=pairs)
    assert torch.equal(listed.values, r.values)
    start = patch_sweep(model, LONG, SHORT, metric=logit_diff(300, 277), align="start")
    assert start.sources == tuple(range(len(corrupt)))
    assert (start.values - r.values).abs().max() > 1e-2


def test_unpaired_positions_are_skipped_by_default_and_refused_when_asked(
    model: EagerModel,
) -> None:
    # The corrupt prompt is the longer one: its first positions have no clean partner.
    n_long, n_short = len(model.to_tokens(LONG)), len(model.to_tokens(SHORT))
    gap = n_long - n_short
    r = patch_sweep(model, SHORT, LONG, metric=logit_diff(300, 277), layers=(1,), align="end")
    assert r.cols == tuple(range(gap, n_long)) and r.sources == tuple(range(n_short))
    with pytest.raises(BadPromptError, match=r"corrupt positions \[0\] have no clean partner"):
        patch_sweep(
            model, SHORT, LONG, metric=logit_diff(300, 277), positions=(0, gap), align="end"
        )
    with pytest.raises(BadPromptError, match="heads=True patches a head at every"):
        patch_sweep(
            model, SHORT, LONG, metric=logit_diff(300, 277), point="z", heads=True, align="end"
        )
    with pytest.raises(SteeringSpecError, match="outside the prompts"):
        patch_sweep(model, SHORT, LONG, metric=logit_diff(300, 277), align=[(n_short, 0)])
    with pytest.raises(SteeringSpecError, match='"start", "end"'):
        patch_sweep(model, SHORT, LONG, metric=logit_diff(300, 277), align="middle")


def test_ragged_prompts_with_a_multi_token_answer(model: EagerModel) -> None:
    clean, corrupt = model.to_tokens(LONG), model.to_tokens(SHORT)
    gap = len(clean) - len(corrupt)
    paris = _tokens(model, " Paris")
    r = patch_sweep(model, LONG, SHORT, metric=answer_prob(" Paris"), layers=(1, 3), align="end")
    source = _hf_block_inputs(model, clean)

    def cell(layer: int, p: int, src: int) -> float:
        return float(
            torch.tensor(
                _logprob(model, corrupt, paris, layer=layer, pos=p, row=source[layer][src])
            ).exp()
        )

    want = torch.tensor(
        [[cell(layer, p, p + gap) for p in range(len(corrupt))] for layer in (1, 3)]
    )
    assert (r.values - want).abs().max() <= TOL * want.abs().max()
    assert r.clean == pytest.approx(
        float(torch.tensor(_logprob(model, clean, paris)).exp()), rel=TOL
    )
    wrong = torch.tensor([cell(layer, 2, 2 + gap - 1) for layer in (1, 3)])
    assert (wrong - r.values[:, 2]).abs().max() > 1e-3 * want.abs().max()
