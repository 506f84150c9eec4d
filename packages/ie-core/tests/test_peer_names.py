"""TransformerLens / nnterp hook names as addresses, through the points' one PeerNames table."""

from __future__ import annotations

import pytest
import torch
from ie_core import POINTS, ActivationCache, Address, get_point, to_address
from ie_core.errors import UnknownCoordinateError, UnknownPointError, UnsupportedOperationError
from ie_core.grammar import from_peer_name, peer_names


@pytest.mark.parametrize(
    ("foreign", "ours"),
    [
        ("blocks.1.hook_resid_post", "resid_post.1"),
        ("blocks.12.hook_resid_pre", "resid_pre.12"),
        ("blocks.3.attn.hook_z", "z.3"),
        ("blocks.0.attn.hook_v", "value.0"),
        ("blocks.2.attn.hook_pattern", "attn_probs.2"),
        ("blocks.2.mlp.hook_post", "mlp_act.2"),
        ("hook_embed", "embeddings"),
        ("ln_final.hook_normalized", "final_norm"),  # classic HookedTransformer spelling
        ("ln_final.hook_out", "final_norm"),  # TransformerBridge spelling, as in the table
        ("blocks.4.ln2.hook_normalized", "mlp_in.4"),
        ("layers_output[4]", "resid_post.4"),  # nnterp
        ("attentions_input[0]", "attn_in.0"),
        ("token_embeddings", "embeddings"),
        ("logits", "lm_head"),
    ],
)
def test_peer_names_become_our_addresses(foreign: str, ours: str) -> None:
    assert to_address(foreign, check=True) == to_address(ours)


def test_every_table_entry_is_accepted() -> None:
    """Each TL / nnterp pattern on every point maps back to a point that lists it."""
    seen = 0
    for point in POINTS:
        for pattern in (point.peers.transformer_lens, point.peers.nnterp):
            if pattern is None:
                continue
            address = to_address(pattern.replace("{L}", "7"), check=True)
            assert address.layer == (7 if point.per_layer else None)
            mapped = get_point(address.name)
            assert pattern in (mapped.peers.transformer_lens, mapped.peers.nnterp)
            seen += 1
    assert seen >= 30 and len(peer_names()) >= seen - 2


def test_a_shared_tl_name_is_the_tensor_added_to_the_residual() -> None:
    # TL's hook_attn_out / hook_mlp_out are what each block adds: our _post points.
    assert to_address("blocks.2.hook_attn_out") == Address("attn_out_post", 2)
    assert to_address("blocks.2.hook_mlp_out") == Address("mlp_out_post", 2)


def test_our_grammar_is_unchanged() -> None:
    assert from_peer_name("resid_post.3") is None
    assert to_address("resid_post.3.stream-1") == Address("resid_post", 3, 1)
    assert to_address("path.model.layers.3.mlp").is_path


@pytest.mark.parametrize(
    ("text", "error", "hint"),
    [
        ("blocks.1.hook_resid_pst", UnknownCoordinateError, "'resid_post.1'"),
        ("blocks.0.attn.hook_zz", UnknownCoordinateError, "'z.0'"),
        ("hook_embd", UnknownPointError, "'embeddings'"),
        ("resid_pots", UnknownPointError, "did you mean 'resid_post'"),
    ],
)
def test_a_near_miss_names_the_nearest_point(text: str, error: type, hint: str) -> None:
    with pytest.raises(error, match=r"nearest|did you mean") as raised:
        to_address(text, check=True)
    assert hint in str(raised.value)


def test_cache_is_keyed_by_our_names_and_indexed_by_either() -> None:
    t = torch.arange(24.0).reshape(1, 2, 12)
    cache = ActivationCache({"blocks.1.hook_resid_post": t})
    assert list(cache) == ["resid_post.1"] and cache.addresses() == [Address("resid_post", 1)]
    assert cache["resid_post.1"] is t and cache["blocks.1.hook_resid_post"] is t
    assert "layers_output[1]" in cache


def test_heads_splits_columns_by_head() -> None:
    z = torch.arange(2 * 3 * 12.0).reshape(2, 3, 12)
    cache = ActivationCache({"z.0": z, "value.0": z, "resid_post.0": z}).with_heads(4, 2)
    heads = cache.heads("blocks.0.attn.hook_z")
    assert heads.shape == (2, 3, 4, 3)
    for h in range(4):  # head h is columns h*d_head .. (h+1)*d_head, written out
        assert torch.equal(heads[:, :, h], z[:, :, 3 * h : 3 * h + 3])
    assert cache.heads("value.0").shape == (2, 3, 2, 6)  # KV heads
    with pytest.raises(UnsupportedOperationError, match="not a per-head point"):
        cache.heads("resid_post.0")
    with pytest.raises(UnsupportedOperationError, match="pass it"):
        ActivationCache({"z.0": z}).heads("z.0")
    with pytest.raises(UnsupportedOperationError, match="multiple of 5"):
        cache.heads("z.0", n_heads=5)


@pytest.mark.parametrize(
    ("foreign", "ours"),
    [
        ("resid_pre", "resid_pre"),
        ("hook_resid_pre", "resid_pre"),
        ("blocks.{L}.hook_resid_post", "resid_post"),
        ("attn.hook_z", "z"),
        ("hook_z", "z"),
        ("hook_pattern", "attn_probs"),
        ("hook_attn_out", "attn_out_post"),  # what TL adds to the residual, as in addresses
        ("ln2.hook_normalized", "mlp_in"),
        ("layers_output", "resid_post"),
        ("hook_embed", "embeddings"),
    ],
)
def test_point_arguments_take_layer_free_peer_names(foreign: str, ours: str) -> None:
    from ie_core.grammar import point_name

    assert point_name(foreign) == ours


def test_a_point_argument_that_names_no_point_is_refused_with_the_nearest() -> None:
    from ie_core.grammar import point_name

    with pytest.raises(UnknownPointError, match="did you mean 'resid_pre'"):
        point_name("hook_resid_pr")
    with pytest.raises(UnknownPointError):
        point_name("hook_out")  # ln1, ln2, ln_final and unembed all end so: ambiguous
