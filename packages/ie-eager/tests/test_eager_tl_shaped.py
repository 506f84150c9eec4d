"""TransformerLens-shaped SyncModel on eager, checked against the plain HF forward; the async
model's guard against use without `await`."""

from __future__ import annotations

import gc

import ie_core
import pytest
import torch
from eager_support import PROMPT, synthetic_model
from ie_core import SamplingParams, SyncModel
from ie_core.errors import BadPromptError, NotAwaitedError, SamplingParamsError

TOL = 1e-5  # fp32 CPU within one backend


@pytest.fixture(scope="module")
def gemma2() -> SyncModel:
    return SyncModel(synthetic_model("gemma2"))  # softcapped logits, GQA: 4 heads, 2 KV heads


def hf_logits(model: SyncModel, ids: list[list[int]]) -> torch.Tensor:
    with torch.no_grad():
        return model.hf_model(input_ids=torch.tensor(ids)).logits


def test_calling_the_model_gives_the_hf_logits(gemma2: SyncModel) -> None:
    ids = gemma2.to_tokens([PROMPT, PROMPT.upper()[: len(PROMPT)]])
    ids = [row[: min(map(len, ids))] for row in ids]  # one length: a rectangular batch
    logits = gemma2(ids)
    expected = hf_logits(gemma2, ids)
    assert logits.shape == expected.shape
    assert torch.allclose(logits, expected, atol=TOL, rtol=0)
    # Negative control: the raw unembed lacks Gemma 2's final softcap (30), so it differs, and
    # the softcap written out here brings it to the HF logits.
    raw = gemma2.capture(ids, ["lm_head"])["lm_head"]
    assert (raw - expected).abs().max() > 10 * TOL
    assert torch.allclose(30.0 * torch.tanh(raw / 30.0), expected, atol=TOL, rtol=0)


def test_run_with_cache_takes_tl_names_and_files_them_under_ours(gemma2: SyncModel) -> None:
    ids = gemma2.to_tokens(PROMPT, batch=True)
    logits, cache = gemma2.run_with_cache(ids, ["blocks.1.hook_resid_post", "hook_embed"])
    assert [str(a) for a in cache] == ["resid_post.1", "embeddings"]
    with torch.no_grad():
        out = gemma2.hf_model(input_ids=torch.tensor(ids), output_hidden_states=True)
    # hidden_states[L + 1] is block L's output for every block but the last (normed there).
    assert torch.allclose(cache["blocks.1.hook_resid_post"], out.hidden_states[2], atol=TOL, rtol=0)
    assert torch.allclose(logits, out.logits, atol=TOL, rtol=0)


def test_heads_view_of_z_and_value(gemma2: SyncModel) -> None:
    ids = gemma2.to_tokens(PROMPT, batch=True)
    _, cache = gemma2.run_with_cache(ids, ["blocks.0.attn.hook_z", "value.0", "attn_out.0"])
    z = cache.heads("z.0")
    assert z.shape == (1, len(ids[0]), 4, 64)
    assert cache.heads("blocks.0.attn.hook_v").shape == (1, len(ids[0]), 2, 64)
    # Independent check: each head's slice through its own columns of o_proj sums to attn_out.
    o_proj = gemma2.hf_model.model.layers[0].self_attn.o_proj.weight  # [d_model, heads * d_head]
    per_head = torch.einsum("bshd,mhd->bsm", z, o_proj.reshape(-1, 4, 64))
    assert torch.allclose(per_head, cache["attn_out.0"], atol=TOL, rtol=0)


def test_token_helpers(gemma2: SyncModel) -> None:
    ids = gemma2.to_tokens(PROMPT)
    assert gemma2.to_tokens(PROMPT, batch=True) == [ids]
    assert gemma2.to_tokens(["a", "b"]) == [gemma2.to_tokens("a"), gemma2.to_tokens("b")]
    pieces = gemma2.to_str_tokens(PROMPT)
    assert len(pieces) == len(ids) and pieces[1:] == [gemma2.to_string([i]) for i in ids[1:]]
    batch = [ids, ids[:3]]
    assert gemma2.to_string(batch[0]) == gemma2.model.to_string(ids)
    assert gemma2.to_string(batch) == [gemma2.model.to_string(ids), gemma2.model.to_string(ids[:3])]
    assert gemma2.to_string(torch.tensor(batch[1])) == gemma2.model.to_string(ids[:3])
    assert gemma2.to_string(ids[1]) == gemma2.model.to_string([ids[1]])
    single = gemma2.to_tokens("a", prepend_bos=False)
    assert len(single) == 1 and gemma2.to_single_token("a") == single[0]
    with pytest.raises(BadPromptError, match="not one"):
        gemma2.to_single_token(PROMPT)


def test_generate_takes_sampling_keywords(gemma2: SyncModel) -> None:
    by_keyword = gemma2.generate("Hello", max_new_tokens=5, stop_at_eos=False)
    by_params = gemma2.generate("Hello", SamplingParams(max_new_tokens=5, stop_at_eos=False))
    assert by_keyword == by_params and len(by_keyword.token_ids) == 5
    with pytest.raises(SamplingParamsError, match="not both"):
        gemma2.generate("Hello", SamplingParams(), max_new_tokens=5)


def test_the_async_model_refuses_use_without_await() -> None:
    model = ie_core.load_model("ie-synthetic/gemma2", backend="eager")
    pending = model.capture(PROMPT, ["resid_post.0"])
    with pytest.raises(NotAwaitedError, match=r"await model\.capture"):
        pending["resid_post.0"]
    with pytest.warns(RuntimeWarning, match="never ran"):
        del pending
        gc.collect()
    with pytest.warns(RuntimeWarning), pytest.raises(NotAwaitedError, match="SyncModel"):
        _ = model.generate("Hi").text
    # Awaited (here through the runner) it is the ordinary call.
    cache = ie_core.capture(model, PROMPT, ["resid_post.0"])
    assert cache["resid_post.0"].shape[-1] == model.d_model


def test_the_free_run_with_cache_knows_the_head_counts(gemma2: SyncModel) -> None:
    """`run_with_cache(model, ids, ...)` then `cache.heads("z.0")` without `n_heads` (it was
    "this cache does not know the model's head count; pass it"); a bare cache still asks."""
    from ie_core import run_with_cache
    from ie_core.cache import ActivationCache
    from ie_core.errors import UnsupportedOperationError

    ids = gemma2.to_tokens(PROMPT, batch=True)
    _, cache = run_with_cache(gemma2.model, ids, ["z.0", "value.0"])
    assert cache.heads("z.0").shape == (1, len(ids[0]), 4, 64)
    assert cache.heads("value.0").shape == (1, len(ids[0]), 2, 64)
    with pytest.raises(UnsupportedOperationError, match="does not know the model's head count"):
        ActivationCache({"z.0": cache["z.0"]}).heads("z.0")


def test_point_arguments_take_transformer_lens_names(gemma2: SyncModel) -> None:
    """`point="hook_resid_pre"` in patch_sweep / attribution_patch (was "UnknownPointError ...
    did you mean 'resid_pre'?") gives exactly the native-named call; so do TL addresses in
    mean_activation and a TL name as a Steering's point."""
    from ie_core import Additive
    from ie_core.errors import UnknownPointError
    from ie_core.experiments.patching import logit_diff, mean_activation, patch_sweep
    from ie_core.experiments.user_hooks import attribution_patch
    from ie_core.ops import Steering

    clean, corrupt = [5, 17, 99, 42, 7], [5, 23, 99, 42, 7]
    metric = logit_diff(11, 12)
    model = gemma2.model
    for tl, ours in (("hook_resid_pre", "resid_pre"), ("blocks.{L}.hook_resid_post", "resid_post")):
        kw = {"metric": metric, "layers": (0, 1)}
        assert patch_sweep(model, clean, corrupt, point=tl, **kw).point == ours
        a = patch_sweep(model, clean, corrupt, point=tl, **kw)
        b = patch_sweep(model, clean, corrupt, point=ours, **kw)
        assert a == b and torch.equal(a.values, b.values)
        a = attribution_patch(gemma2, clean, corrupt, point=tl, **kw)
        b = attribution_patch(gemma2, clean, corrupt, point=ours, **kw)
        assert a == b and torch.equal(a.values, b.values)
    heads_tl = patch_sweep(model, clean, corrupt, metric=metric, point="attn.hook_z", heads=True)
    heads = patch_sweep(model, clean, corrupt, metric=metric, point="z", heads=True)
    assert heads_tl.point == "z" and torch.equal(heads_tl.values, heads.values)
    assert torch.equal(
        mean_activation(model, [clean, corrupt], "blocks.1.hook_resid_post"),
        mean_activation(model, [clean, corrupt], "resid_post.1"),
    )
    v = torch.ones(model.d_model)
    assert Steering("hook_resid_post", (1,), (Additive(v),)) == Steering(
        "resid_post", (1,), (Additive(v),)
    )
    # A name that maps to no point is still refused, with the nearest point.
    with pytest.raises(UnknownPointError, match="did you mean 'resid_post'"):
        patch_sweep(model, clean, corrupt, metric=metric, point="hook_resid_pst")


class _AddsNoBos:
    """A real tokenizer that adds no BOS of its own (as SmolLM2's), with `bos_token_id` given."""

    def __init__(self, tokenizer: object, bos_token_id: int | None) -> None:
        self._tokenizer, self.bos_token_id = tokenizer, bos_token_id

    def __call__(self, text: str, add_special_tokens: bool = True) -> object:
        return self._tokenizer(text, add_special_tokens=False)  # type: ignore[operator]

    def __getattr__(self, name: str) -> object:
        return getattr(self._tokenizer, name)


def test_prepend_bos_true_prepends_the_bos_on_every_tokenizer() -> None:
    """`to_tokens(text, prepend_bos=True)` added nothing where the tokenizer adds no BOS itself;
    now the BOS goes first (once), and a tokenizer without one refuses, saying what to do."""
    from ie_eager.backend import load
    from ie_eager.synthetic import build

    model = SyncModel(load(str(build("llama")), device="cpu", dtype="float32"))
    real = model.model.tokenizer
    body = model.to_tokens(PROMPT, prepend_bos=False)
    bos = real.bos_token_id
    assert model.to_tokens(PROMPT, prepend_bos=True) == [bos, *body] == model.to_tokens(PROMPT)
    model.model.tokenizer = _AddsNoBos(real, bos)
    assert model.to_tokens(PROMPT) == body  # the default: the tokenizer's own special tokens
    assert model.to_tokens(PROMPT, prepend_bos=True) == [bos, *body]
    assert model.to_tokens([PROMPT], prepend_bos=True) == [[bos, *body]]
    assert model.to_str_tokens(PROMPT, prepend_bos=True)[0] == real.decode([bos])
    model.model.tokenizer = _AddsNoBos(real, None)
    with pytest.raises(BadPromptError, match="this tokenizer has none"):
        model.to_tokens(PROMPT, prepend_bos=True)
    assert model.to_tokens(PROMPT) == body


def test_run_with_cache_without_names_caches_every_point(gemma2: SyncModel) -> None:
    """`run_with_cache(ids)` (was "needs the points to keep") holds every point the model serves
    at every layer it serves it, each equal to its own capture; the free function alike."""
    from ie_core import run_with_cache

    ids = gemma2.to_tokens(PROMPT, batch=True)
    logits, cache = gemma2.run_with_cache(ids)
    served = {
        (name, layer)
        for name, cap in gemma2.capabilities().items()
        if cap.served
        for layer in (cap.layers or (None,))
    }
    assert {(a.name, a.layer) for a in cache.addresses()} == served
    assert {"embeddings", "resid_post.1", "attn_probs.0", "z.1", "lm_head"} <= set(map(str, cache))
    assert torch.allclose(logits, hf_logits(gemma2, ids), atol=TOL, rtol=0)
    for address in cache:
        alone = gemma2.capture(ids, [address])[address]
        assert torch.allclose(cache[address], alone, atol=TOL, rtol=0), address
    free_logits, free = run_with_cache(gemma2.model, ids)
    assert list(free) == list(cache) and free.heads("z.0").shape == cache.heads("z.0").shape
    assert torch.equal(free_logits, logits)


def test_names_filter_keeps_by_either_name_or_by_list(gemma2: SyncModel) -> None:
    ids = gemma2.to_tokens(PROMPT, batch=True)
    _, tl = gemma2.run_with_cache(ids, names_filter=lambda n: n.endswith("hook_resid_post"))
    _, ours = gemma2.run_with_cache(ids, names_filter=lambda n: n.startswith("resid_post."))
    every_layer = [f"resid_post.{i}" for i in range(gemma2.n_layers)]
    assert list(map(str, tl)) == list(map(str, ours)) == every_layer
    _, listed = gemma2.run_with_cache(ids, names_filter=["hook_z", "blocks.0.hook_resid_pre"])
    z = [f"z.{i}" for i in range(gemma2.n_layers)]
    assert list(map(str, listed)) == ["resid_pre.0", *z]
    with pytest.raises(BadPromptError, match="keeps none"):
        gemma2.run_with_cache(ids, names_filter=lambda n: False)
    with pytest.raises(BadPromptError, match="not both"):
        gemma2.run_with_cache(ids, ["z.0"], names_filter=["z"])


def test_the_everything_cache_is_refused_above_its_budget_with_the_bytes(
    gemma2: SyncModel,
) -> None:
    from ie_core.tl_shaped import cache_bytes, every_address

    ids = gemma2.to_tokens(PROMPT, batch=True)
    estimate = cache_bytes(gemma2.model, ids, every_address(gemma2.model))
    _, cache = gemma2.run_with_cache(ids, max_cache_bytes=estimate)  # at the budget: served
    # The estimate is what the cache holds (fp32, one prompt: nothing padded).
    assert estimate == sum(t.numel() * t.element_size() for t in cache.values())
    with pytest.raises(BadPromptError, match=rf"about {estimate} bytes .*max_cache_bytes=1000\b"):
        gemma2.run_with_cache(ids, max_cache_bytes=1000)
    small = cache_bytes(gemma2.model, ids, every_address(gemma2.model, ["resid_post"]))
    _, kept = gemma2.run_with_cache(ids, names_filter=["resid_post"], max_cache_bytes=small)
    assert len(kept) == gemma2.n_layers


def test_attribution_per_head_sums_to_the_position_result_and_matches_hf_gradients(
    gemma2: SyncModel,
) -> None:
    """`attribution_patch(..., point="z", heads=True)` (was a TypeError): [layers, positions,
    heads], summing over heads to `heads=False`, and each head equal to (clean - corrupt) . grad
    computed here on the HF model with a hook on o_proj's input."""
    from ie_core.errors import SteeringSpecError
    from ie_core.experiments.patching import logit_diff
    from ie_core.experiments.user_hooks import attribution_patch

    clean, corrupt = [5, 17, 99, 42, 7], [5, 23, 99, 42, 7]
    metric = logit_diff(11, 12)
    kw = {"metric": metric, "point": "z", "layers": (0, 2)}
    per_head = attribution_patch(gemma2, clean, corrupt, heads=True, **kw)
    whole = attribution_patch(gemma2, clean, corrupt, **kw)
    assert per_head.values.shape == (2, len(clean), 4)
    delta = per_head.values - per_head.corrupt
    assert torch.allclose(delta.sum(-1), whole.values - whole.corrupt, atol=TOL, rtol=0)
    # The reference: d metric / d (o_proj input) on the HF forward, split by head by hand.
    layer = 2
    o_proj = gemma2.hf_model.model.layers[layer].self_attn.o_proj
    seen: dict[str, torch.Tensor] = {}

    def pre(_m: object, args: tuple) -> tuple:
        x = args[0].detach().requires_grad_(True)
        seen["z"] = x
        return (x, *args[1:])

    handle = o_proj.register_forward_pre_hook(pre)
    try:
        logits = gemma2.hf_model(input_ids=torch.tensor([corrupt])).logits[0, -1]
        (grad,) = torch.autograd.grad(logits[11] - logits[12], [seen["z"]])
    finally:
        handle.remove()
    z_clean = gemma2.capture([clean], ["z.2"])["z.2"]
    z_corrupt = gemma2.capture([corrupt], ["z.2"])["z.2"]
    want = ((z_clean - z_corrupt) * grad)[0].reshape(len(clean), 4, -1).sum(-1)
    assert torch.allclose(delta[1], want, atol=1e-4, rtol=0)
    with pytest.raises(SteeringSpecError, match="not a per-head point"):
        attribution_patch(gemma2, clean, corrupt, metric=metric, point="resid_pre", heads=True)


def test_free_and_method_run_with_cache_return_tl_shape_and_string_keys(gemma2: SyncModel) -> None:
    """Issue 68: the free `run_with_cache` returned the cache alone and the method `(logits,
    cache)`; both are TransformerLens's pair now, `capture` is the cache alone, and the cache's
    keys are strings as docs/COMING_FROM.md prints them. Indexing the pair the old way warns."""
    from ie_core import capture, run_with_cache

    ids = gemma2.to_tokens(PROMPT, batch=True)
    names = ["blocks.3.hook_resid_post", "blocks.3.attn.hook_z"]
    for model in (gemma2, gemma2.model):
        logits, cache = run_with_cache(model, ids, names)
        assert torch.allclose(logits, hf_logits(gemma2, ids), atol=TOL, rtol=0)
        assert list(cache) == ["resid_post.3", "z.3"] and list(cache.keys()) == list(cache)
        assert [k for k, _ in cache.items()] == ["resid_post.3", "z.3"]
    method_logits, method_cache = gemma2.run_with_cache(ids, names)
    assert torch.equal(method_logits, logits) and list(method_cache) == list(cache)
    alone = capture(gemma2, ids, names)
    assert list(alone) == ["resid_post.3", "z.3"] and torch.equal(alone["z.3"], cache["z.3"])
    with pytest.warns(DeprecationWarning, match="capture"):
        old = run_with_cache(gemma2, ids, names)["resid_post.3"]
    assert torch.equal(old, cache["resid_post.3"])
