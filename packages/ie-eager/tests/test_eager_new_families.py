"""Invariants of the families with their own trunk or attention (fp32, CPU): DeepSeek-V4's four
hyper-connection streams, Qwen3-Next's linear-attention layers and gated attention, DeepSeek-V3's
latent attention, gpt-oss's attention sinks, LFM2's and Granite-4.0-H's hybrid layers. Each compares against an independent computation
(HF's own outputs or a formula by hand from the module's parameters), with a negative control.

Tolerance: 1e-5 absolute and relative (fp32, one backend; only summation order differs)."""

from __future__ import annotations

import functools

import pytest
import torch
from eager_support import PROMPT, SPECIAL_SLUGS, synthetic_model
from ie_core.cache import ActivationCache
from ie_core.errors import PointUnavailableError
from ie_core.grammar import Trait, get_family, get_point
from ie_core.ops import Additive, steer_at
from ie_core.protocol import SamplingParams
from ie_core.runner import run
from ie_eager.backend import EagerModel

TOL = {"atol": 1e-5, "rtol": 1e-5}
V4 = "deepseek-v4"


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, **TOL)


def served(model: EagerModel, name: str, layer: int, stream: int | None = None) -> bool:
    try:
        model.resolve((name, layer, stream) if stream is not None else (name, layer))
        return True
    except PointUnavailableError:
        return False


def addresses(model: EagerModel) -> list:
    out: list = []
    for name in model.points():
        if not get_point(name).per_layer:
            out.append(name)
            continue
        for layer in range(model.n_layers):
            if served(model, name, layer):
                out.append((name, layer))
            for s in range(model.structure.n_streams if model.structure.multi_stream else 0):
                if served(model, name, layer, s):
                    out.append((name, layer, s))
    return out


@functools.cache
def full(slug: str) -> tuple[torch.Tensor, ActivationCache]:
    model = synthetic_model(slug)
    return model.forward_with_cache([model.to_tokens(PROMPT)], addresses(model))


@functools.cache
def hf(slug: str):
    """The family's own forward, with attentions and hidden states (the independent side)."""
    model = synthetic_model(slug)
    ids = torch.tensor([model.to_tokens(PROMPT)])
    with torch.no_grad():
        return model.hf_model(ids, output_attentions=True, output_hidden_states=True)


def softmax_layers(model: EagerModel) -> list[int]:
    return [i for i in range(model.n_layers) if served(model, "attn_probs", i)]


@pytest.mark.parametrize("slug", SPECIAL_SLUGS)
def test_points_equal_the_family_registry(slug: str) -> None:
    model = synthetic_model(slug)
    assert model.family is get_family(slug)
    assert set(model.points()) == {p.name for p in get_family(slug).points}


@pytest.mark.parametrize("slug", [s for s in SPECIAL_SLUGS if s != V4])
def test_residual_decomposes_on_every_layer(slug: str) -> None:
    # Hybrid layers included: the linear-attention mixer writes through attn_out.
    model = synthetic_model(slug)
    cache = full(slug)[1]
    for i in range(model.n_layers):
        pre, post = cache[("resid_pre", i)], cache[("resid_post", i)]
        attn, mlp = cache[("attn_out_post", i)], cache[("mlp_out_post", i)]
        assert close(pre + attn + mlp, post), f"{slug} layer {i}"
        assert close(pre + attn, cache[("resid_mid", i)])
        assert not close(pre + mlp, post)


@pytest.mark.parametrize("slug", SPECIAL_SLUGS)
def test_attn_probs_are_the_familys_own_attention_weights(slug: str) -> None:
    model = synthetic_model(slug)
    cache, own = full(slug)[1], hf(slug).attentions
    layers = softmax_layers(model)
    assert layers
    if len(own) < model.n_layers:  # hybrid: HF returns weights of softmax layers only
        own = dict(zip(layers, own, strict=True))
    for i in layers:
        assert close(cache[("attn_probs", i)], own[i]), f"{slug} layer {i}"
    assert not close(cache[("attn_probs", layers[0])], own[layers[0]].roll(1, dims=-1))


@pytest.mark.parametrize("slug", SPECIAL_SLUGS)
def test_softmax_of_scores_is_probs_with_sinks(slug: str) -> None:
    model = synthetic_model(slug)
    cache = full(slug)[1]
    sinks = model.family.has(Trait.ATTENTION_SINKS)
    for i in softmax_layers(model):
        scores, probs = cache[("attn_scores", i)], cache[("attn_probs", i)]
        low = torch.finfo(scores.dtype).min
        future = torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1)
        assert bool((scores[..., future] <= low / 2).all())
        if sinks:
            attn = model.structure.blocks[i].attn[1]
            sink = attn.sinks.detach().reshape(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
            expected = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
            assert close(expected, probs), f"{slug} layer {i}"
            assert bool((probs.sum(-1) < 1).all())  # the sink takes a share of every row
            assert not close(torch.softmax(scores, dim=-1), probs)
        else:
            assert close(torch.softmax(scores, dim=-1), probs)
            assert not close(torch.softmax(scores, dim=-2), probs)


def test_gated_attention_z_is_probs_times_value_times_gate() -> None:
    model = synthetic_model("qwen3-next")
    sh = model.structure.shapes
    cache = full("qwen3-next")[1]
    (layer,) = softmax_layers(model)
    probs, value, z = (cache[(n, layer)] for n in ("attn_probs", "value", "z"))
    gate = cache[("attn_gate", layer)]
    b, s, _ = value.shape
    v = value.view(b, s, sh.n_kv_heads, sh.head_dim).transpose(1, 2)
    v = v.repeat_interleave(sh.n_heads // sh.n_kv_heads, dim=1)
    mixed = (probs @ v).transpose(1, 2).flatten(-2)
    assert close(mixed * gate, z)
    assert not close(mixed, z)  # negative control: the gate matters
    # Independent: the gate by hand from attn_in and q_proj's weight ([q | gate] per head).
    q_proj = model.structure.blocks[layer].attn[1].q_proj
    with torch.no_grad():
        raw = q_proj(cache[("attn_in", layer)]).view(b, s, sh.n_heads, 2 * sh.head_dim)
    assert close(torch.sigmoid(raw[..., sh.head_dim :]).flatten(-2), gate)
    assert not close(torch.sigmoid(raw[..., : sh.head_dim]).flatten(-2), gate)


@pytest.mark.parametrize("slug", ["qwen3-next", "lfm2", "granitemoehybrid"])
def test_linear_attention_layers_refuse_attention_points_per_layer(slug: str) -> None:
    model = synthetic_model(slug)
    softmax = softmax_layers(model)
    assert 0 < len(softmax) < model.n_layers
    for layer in range(model.n_layers):
        if layer in softmax:
            continue
        for name in ("attn_probs", "value", "z", "q_norm_in"):
            with pytest.raises(PointUnavailableError, match=f"layer {layer} .*linear-attention"):
                model.resolve((name, layer))
        assert served(model, "attn_out", layer) and served(model, "resid_mid", layer)


def test_mla_value_is_the_per_head_value_decompressed_from_the_latent() -> None:
    model = synthetic_model("deepseek-v3")
    config = model.text_config
    sh = model.structure.shapes
    cache = full("deepseek-v3")[1]
    for layer in softmax_layers(model):
        attn = model.structure.blocks[layer].attn[1]
        with torch.no_grad():
            latent = attn.kv_a_proj_with_mqa(cache[("attn_in", layer)])[..., : config.kv_lora_rank]
            kv = attn.kv_b_proj(attn.kv_a_layernorm(latent))
        kv = kv.unflatten(-1, (sh.n_heads, config.qk_nope_head_dim + config.v_head_dim))
        value = cache[("value", layer)]
        assert value.shape[-1] == sh.n_heads * config.v_head_dim
        assert close(kv[..., config.qk_nope_head_dim :].flatten(-2), value)
        assert not close(kv[..., : config.v_head_dim].flatten(-2), value)  # the k_nope half
        # And it is what attention mixes: probs @ value is z.
        v = value.unflatten(-1, (sh.n_heads, config.v_head_dim)).transpose(1, 2)
        z = (cache[("attn_probs", layer)] @ v).transpose(1, 2).flatten(-2)
        assert close(z, cache[("z", layer)])


def test_sink_probs_times_value_is_z() -> None:
    # MLA and the gated attention have their own z tests; DeepSeek-V4 has no value point.
    slug = "gpt-oss"
    model = synthetic_model(slug)
    sh = model.structure.shapes
    cache = full(slug)[1]
    for layer in softmax_layers(model):
        value = cache[("value", layer)]
        b, s, _ = value.shape
        v = value.view(b, s, sh.n_kv_heads, sh.head_dim).transpose(1, 2)
        v = v.repeat_interleave(sh.n_heads // sh.n_kv_heads, dim=1)
        probs = cache[("attn_probs", layer)]
        assert close((probs @ v).transpose(1, 2).flatten(-2), cache[("z", layer)])
        renormed = probs / probs.sum(-1, keepdim=True)  # negative control: ignoring the sink
        assert not close((renormed @ v).transpose(1, 2).flatten(-2), cache[("z", layer)])


@pytest.mark.parametrize("slug", [s for s in SPECIAL_SLUGS if get_family(s).has(Trait.MOE)])
def test_router_points_are_the_routers_own(slug: str) -> None:
    model = synthetic_model(slug)
    cache = full(slug)[1]
    sparse = [i for i in range(model.n_layers) if served(model, "router_logits", i)]
    assert sparse
    for i in sparse:
        router = model.structure.blocks[i].sub(model.structure.blocks[i].mlp, ("gate", "router"))
        weight, bias = router[1].weight, getattr(router[1], "bias", None)
        with torch.no_grad():
            logits = torch.nn.functional.linear(cache[("mlp_in", i)].float(), weight.float(), bias)
        assert close(cache[("router_logits", i)].float(), logits)
        # Top-k by the family's choice score: the logits (softmax routers), or DeepSeek / GLM's
        # score (sigmoid, sqrt-softplus) plus the correction bias.
        bias = getattr(router[1], "e_score_correction_bias", None)
        choice = logits
        if bias is not None:
            choice = getattr(router[1], "score_fn", torch.sigmoid)(logits) + bias
        k = cache[("expert_indices", i)].shape[-1]
        chosen = cache[("expert_indices", i)].sort(-1).values
        assert torch.equal(chosen, choice.topk(k, -1).indices.sort(-1).values)
        assert not torch.equal(chosen, (-choice).topk(k, -1).indices.sort(-1).values)


@pytest.mark.parametrize("slug", [s for s in SPECIAL_SLUGS if s != V4])
def test_lens_on_last_resid_post_is_the_logits(slug: str) -> None:
    model = synthetic_model(slug)
    logits, cache = full(slug)
    last = cache[("resid_post", model.n_layers - 1)]
    assert close(run(model.decode_residuals(last)), logits)
    assert not close(model.structure.lm_head[1](last).detach(), logits)


@pytest.mark.parametrize("slug", SPECIAL_SLUGS)
def test_steering_changes_the_logits_and_capture_does_not(slug: str) -> None:
    model = synthetic_model(slug)
    ids = [model.to_tokens(PROMPT)]
    plain = model.forward_with_cache(ids, [])[0]
    assert torch.equal(plain, full(slug)[0])
    point = ("resid_pre", 1, 0) if slug == V4 else ("resid_pre", 1)  # layer 1: linear on Next
    steered = model.forward_with_cache(
        ids, [], steering=steer_at(point, Additive([0.5] * model.d_model))
    )[0]
    assert not close(plain, steered)


# --- DeepSeek-V4: four residual streams --------------------------------------------------------


def _streams(cache: ActivationCache, name: str, layer: int, n: int) -> torch.Tensor:
    return torch.stack([cache[(name, layer, s)] for s in range(n)], dim=-2)


def _pre_weights(hc: torch.nn.Module, x: torch.Tensor, eps: float) -> torch.Tensor:
    """The collapse weights by hand: sigmoid(rms(flat(x)) @ fn_pre * scale + base) + hc_eps."""
    n = x.shape[-2]
    flat = x.flatten(-2).float()
    flat = flat * torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + eps)
    mixes = flat @ hc.fn[:n].detach().float().T
    return torch.sigmoid(mixes * hc.scale[0].detach() + hc.base[:n].detach()) + hc.hc_eps


def test_v4_stream_points_have_their_shapes_and_agree() -> None:
    model = synthetic_model(V4)
    n, d = model.structure.n_streams, model.d_model
    cache = full(V4)[1]
    seq = len(model.to_tokens(PROMPT))
    own = hf(V4).hidden_states  # each block's input stack [b, s, n, d], then the final norm
    for i in range(model.n_layers):
        stack = cache[("resid_streams", i)]
        assert stack.shape == (1, seq, n * d)
        for name, width in (("attn_stream_write", n), ("attn_stream_mix", n * n)):
            assert cache[(name, i)].shape == (1, seq, width)
            assert cache[(name.replace("attn", "mlp"), i)].shape == (1, seq, width)
        assert cache[("attn_stream_collapse", i)].shape == (1, seq, d)
        assert close(stack.unflatten(-1, (n, d)), _streams(cache, "resid_post", i, n))
        assert close(_streams(cache, "resid_pre", i, n), own[i])
        if i + 1 < model.n_layers:
            assert close(
                _streams(cache, "resid_pre", i + 1, n), _streams(cache, "resid_post", i, n)
            )
    assert not close(cache[("resid_post", 0, 0)], cache[("resid_post", 0, 1)])


def test_v4_hyper_connections_by_hand() -> None:
    """collapse = sum_s pre_s x_s; out_k = write_k * sublayer + sum_j mix[j, k] x_j."""
    model = synthetic_model(V4)
    n, eps = model.structure.n_streams, model.text_config.rms_norm_eps
    cache = full(V4)[1]
    for i in range(model.n_layers):
        block = model.structure.blocks[i]
        x = _streams(cache, "resid_pre", i, n)
        mid = _streams(cache, "resid_mid", i, n)
        post = _streams(cache, "resid_post", i, n)
        for side, before, after, out in (
            ("attn", x, mid, "attn_out"),
            ("mlp", mid, post, "mlp_out"),
        ):
            hc = (block.attn_hc if side == "attn" else block.mlp_hc)[1]
            pre = _pre_weights(hc, before, eps)
            collapse = (pre.unsqueeze(-1) * before).sum(-2)
            assert close(collapse, cache[(f"{side}_stream_collapse", i)]), f"{side} {i}"
            assert not close(before.mean(-2), cache[(f"{side}_stream_collapse", i)])
            write = cache[(f"{side}_stream_write", i)]
            mix = cache[(f"{side}_stream_mix", i)].unflatten(-1, (n, n))
            sub = cache[(out, i)]
            expected = write.unsqueeze(-1) * sub.unsqueeze(-2) + mix.transpose(-1, -2) @ before
            assert close(expected, after), f"{side} {i}"
            wrong = write.unsqueeze(-1) * sub.unsqueeze(-2) + mix @ before  # untransposed mix
            assert not close(wrong, after)
            # The mix is doubly stochastic (Sinkhorn), up to the iteration's tolerance.
            assert torch.allclose(mix.sum(-2), torch.ones_like(mix.sum(-2)), atol=1e-3)


def test_v4_lens_collapses_the_streams_like_the_model() -> None:
    model = synthetic_model(V4)
    n, d = model.structure.n_streams, model.d_model
    logits, cache = full(V4)
    last = cache[("resid_streams", model.n_layers - 1)]
    assert close(run(model.decode_residuals(last)), logits)
    # The model's own final hidden state (hc_head, then the norm) is final_norm.
    with torch.no_grad():
        own = model.hf_model.model(torch.tensor([model.to_tokens(PROMPT)])).last_hidden_state
    assert close(own, cache["final_norm"])
    # Negative controls: one stream, or the mean of the streams, is not what the model reads.
    stream0 = last.unflatten(-1, (n, d))[..., 0, :]
    assert not close(run(model.decode_residuals(stream0)), logits)
    mean = last.unflatten(-1, (n, d)).mean(-2)
    assert not close(run(model.decode_residuals(mean)), logits)


def test_v4_steering_one_stream_moves_only_that_stream() -> None:
    model = synthetic_model(V4)
    n, d = model.structure.n_streams, model.d_model
    ids = [model.to_tokens(PROMPT)]
    seq = len(ids[0])
    base = full(V4)[1]
    names = [("resid_post", 1, s) for s in range(n)]
    vec = torch.linspace(-1, 1, d)
    _, cache = model.forward_with_cache(
        ids, names, steering=steer_at(("resid_post", 1, 2), Additive(vec.tolist()))
    )
    for s in range(n):
        delta = cache[("resid_post", 1, s)] - base[("resid_post", 1, s)]
        assert close(delta, vec.expand_as(delta) if s == 2 else torch.zeros_like(delta)), s
    # The whole stack takes an n_streams * d_model vector, stream-major; read where the next
    # block receives it, and at the same site (resid_post slices the stack).
    stack_vec = torch.zeros(n * d)
    stack_vec[d : 2 * d] = vec
    nxt = [("resid_pre", 2, s) for s in range(n)]
    _, cache = model.forward_with_cache(
        ids, nxt, steering=steer_at(("resid_streams", 1), Additive(stack_vec.tolist()))
    )
    assert close(cache[("resid_pre", 2, 1)] - base[("resid_pre", 2, 1)], vec.expand(1, seq, d))
    assert close(cache[("resid_pre", 2, 0)], base[("resid_pre", 2, 0)])
    assert not close(cache[("resid_pre", 2, 2)], base[("resid_pre", 2, 1)])


def test_v4_stream_reads_see_writes_at_the_same_site() -> None:
    """resid_post.L.stream-N and resid_streams.L are one tensor: a read of either sees a write
    to the other at block L's output, not the pre-write value."""
    model = synthetic_model(V4)
    n, d = model.structure.n_streams, model.d_model
    ids = [model.to_tokens(PROMPT)]
    base = full(V4)[1]
    vec = torch.linspace(-1, 1, d)
    stack_vec = torch.zeros(n * d)
    stack_vec[d : 2 * d] = vec
    here = [("resid_post", 1, s) for s in range(n)]
    _, cache = model.forward_with_cache(
        ids, here, steering=steer_at(("resid_streams", 1), Additive(stack_vec.tolist()))
    )
    delta = cache[("resid_post", 1, 1)] - base[("resid_post", 1, 1)]
    assert close(delta, vec.expand_as(delta))
    assert close(cache[("resid_post", 1, 0)], base[("resid_post", 1, 0)])
    # The reverse: the stack read sees a one-stream write; negative control, the unsteered stack.
    _, cache = model.forward_with_cache(
        ids, [("resid_streams", 1)], steering=steer_at(("resid_post", 1, 2), Additive(vec.tolist()))
    )
    stack = cache[("resid_streams", 1)].unflatten(-1, (n, d))
    want = base[("resid_streams", 1)].unflatten(-1, (n, d)).clone()
    want[..., 2, :] += vec
    assert close(stack, want)
    assert not close(stack, base[("resid_streams", 1)].unflatten(-1, (n, d)))


def test_v4_refusals_name_the_way_out() -> None:
    model = synthetic_model(V4)
    with pytest.raises(PointUnavailableError, match=r"resid_post\.1\.stream-0"):
        model.resolve(("resid_post", 1))
    with pytest.raises(PointUnavailableError, match="4 residual streams"):
        model.resolve(("resid_pre", 1, 4))
    with pytest.raises(PointUnavailableError, match="shared"):
        model.resolve(("value", 1))
    with pytest.raises(PointUnavailableError, match="take a stream"):
        model.resolve(("attn_out", 1, 0))
    other = synthetic_model("gpt-oss")
    with pytest.raises(PointUnavailableError, match="no multi stream"):
        other.resolve(("resid_streams", 1))


@pytest.mark.parametrize("slug", SPECIAL_SLUGS)
def test_greedy_generation_with_cache_equals_full_forwards(slug: str) -> None:
    """Cached decoding (KV, conv and recurrent state, four streams) against a fresh forward of
    the whole prefix at every step, steered and unsteered."""
    model = synthetic_model(slug)
    prompt = model.to_tokens(PROMPT)
    point = ("resid_pre", 1, 0) if slug == V4 else ("resid_pre", 1)
    for steering in (None, steer_at(point, Additive([0.3] * model.d_model))):
        out = run(
            model.generate(
                prompt, SamplingParams(max_new_tokens=4, stop_at_eos=False), steering=steering
            )
        )
        assert len(out.token_ids) == 4
        ids = list(prompt)
        for token in out.token_ids:
            logits = model.forward_with_cache([ids], [], steering=steering)[0]
            assert int(logits[0, -1].argmax()) == token, (slug, steering is not None)
            ids.append(token)


def test_v4_z_is_the_grouped_output_projections_input() -> None:
    """z (per-head, after the inverse RoPE) through o_a_proj per group, then o_b_proj, is attn_out."""
    model = synthetic_model(V4)
    groups = model.text_config.o_groups
    cache = full(V4)[1]
    for i in softmax_layers(model):
        attn = model.structure.blocks[i].attn[1]
        z = cache[("z", i)]
        assert z.shape[-1] == model.structure.shapes.n_heads * model.structure.shapes.head_dim
        with torch.no_grad():
            out = attn.o_b_proj(attn.o_a_proj(z.unflatten(-1, (groups, -1))).flatten(2))
            rolled = attn.o_b_proj(
                attn.o_a_proj(z.roll(32, -1).unflatten(-1, (groups, -1))).flatten(2)
            )
        assert close(out, cache[("attn_out", i)])
        assert not close(rolled, cache[("attn_out", i)])
