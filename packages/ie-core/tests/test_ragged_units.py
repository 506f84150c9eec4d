"""`capture_ragged` on a stand-in backend whose rows are a known function of each prompt's ids:
grouping by length, the order of prompts, zero right-padding on every sequence axis, the mask and
`unpadded`, without an engine (the eager tests check it on real models)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
from ie_core.cache import ActivationCache
from ie_core.errors import BadPromptError
from ie_core.experiments.ragged import PaddedCache, capture_ragged, seq_dims
from ie_core.ops import Additive, steer_at
from ie_core.sync import SyncModel

HEADS, WIDTH = 2, 3


def rows_of(ids: Sequence[int]) -> torch.Tensor:
    """[len, WIDTH]: row p of a prompt is (id_p, p + 1, 10 * len): unique per prompt and row."""
    n = len(ids)
    return torch.tensor([[float(t), p + 1.0, 10.0 * n] for p, t in enumerate(ids)])


def map_of(ids: Sequence[int]) -> torch.Tensor:
    """[HEADS, len, len] with no zero entry, so padding is told apart from a value."""
    n = len(ids)
    q, k = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    base = (q * n + k + 1).float() + sum(ids)
    return torch.stack([base * (h + 1) for h in range(HEADS)])


class FakeModel:
    """Captures equal-length batches only, as every backend does; records the batches."""

    def __init__(self) -> None:
        self.batches: list[list[list[int]]] = []

    def to_tokens(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    async def capture(self, tokens, addresses, *, steering=None) -> ActivationCache:  # type: ignore[no-untyped-def]
        assert len({len(r) for r in tokens}) == 1, "a ragged batch reached the backend"
        self.batches.append([list(r) for r in tokens])
        out = {}
        for a in addresses:
            make = map_of if a.startswith("attn_probs") else rows_of
            out[a] = torch.stack([make(r) for r in tokens])
        return ActivationCache(out)


PROMPTS = ["abc", "x", [5, 6, 7], "hello", "yz"]  # lengths 3, 1, 3, 5, 2: two share a length


def test_rows_are_each_prompts_own_in_order_and_padded_with_zeros() -> None:
    model = FakeModel()
    cache = capture_ragged(model, PROMPTS, ["resid_post.0", "attn_probs.0"])
    assert isinstance(cache, PaddedCache)
    ids = [model.to_tokens(p) if isinstance(p, str) else p for p in PROMPTS]
    lengths = [len(i) for i in ids]
    assert cache.lengths == tuple(lengths)
    # One capture per length, the two 3-token prompts together.
    assert sorted(len(b) for b in model.batches) == [1, 1, 1, 2]
    resid, probs = cache["resid_post.0"], cache["attn_probs.0"]
    assert resid.shape == (5, 5, WIDTH) and probs.shape == (5, HEADS, 5, 5)
    for i, (row_ids, n) in enumerate(zip(ids, lengths, strict=True)):
        assert torch.equal(resid[i, :n], rows_of(row_ids))
        assert not resid[i, n:].any()
        assert torch.equal(probs[i, :, :n, :n], map_of(row_ids))
        assert not probs[i, :, n:].any() and not probs[i, :, :, n:].any()
        assert torch.equal(cache.unpadded("resid_post.0")[i], rows_of(row_ids))
        assert torch.equal(cache.unpadded("attn_probs.0")[i], map_of(row_ids))
    expected = torch.tensor([[p < n for p in range(5)] for n in lengths])
    assert torch.equal(cache.mask(), expected)
    assert "lengths=[3, 1, 3, 5, 2]" in repr(cache)


def test_sequence_dims_of_maps_and_rows() -> None:
    assert seq_dims("attn_probs.3") == (2, 3) and seq_dims("attn_scores.0") == (2, 3)
    assert seq_dims("resid_post.3") == (1,) and seq_dims("embeddings") == (1,)


def test_a_sync_model_and_one_address_string_are_accepted() -> None:
    inner = FakeModel()
    cache = capture_ragged(SyncModel(inner), ["ab", "c"], "resid_post.1")  # type: ignore[arg-type]
    assert cache.lengths == (2, 1) and len(inner.batches) == 2
    assert torch.equal(cache["resid_post.1"][1, 0], rows_of([ord("c")])[0])


@pytest.mark.parametrize("prompts", ["one string", [], [3.5], [b"bytes"], ("ok", None)])
def test_bad_prompt_lists_are_refused_before_any_capture(prompts: object) -> None:
    model = FakeModel()
    with pytest.raises(BadPromptError, match="capture_ragged takes"):
        capture_ragged(model, prompts, ["resid_post.0"])  # type: ignore[arg-type]
    assert model.batches == []


def test_steering_reaches_every_group_and_one_prompt_works() -> None:
    seen: list[object] = []

    class Recording(FakeModel):
        async def capture(self, tokens, addresses, *, steering=None) -> ActivationCache:  # type: ignore[no-untyped-def]
            seen.append(steering)
            return await super().capture(tokens, addresses)

    spec = steer_at("resid_post.0", Additive(torch.ones(WIDTH)))
    cache = capture_ragged(Recording(), ["ab", "c", "de"], ["resid_post.0"], steering=spec)
    assert seen == [(spec,), (spec,)]  # one capture per length, each steered
    one = capture_ragged(FakeModel(), ["abc"], ["resid_post.0"])
    assert one["resid_post.0"].shape == (1, 3, WIDTH) and cache.lengths == (2, 1, 2)
