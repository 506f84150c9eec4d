"""The one prompt normaliser (`ie_core.prompts`): strict, and consistent between one prompt
(generate) and a batch (capture). Backend-level checks are in ie-eager's test_eager_prompts."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from ie_core.errors import BadPromptError, PromptTooLongError
from ie_core.prompts import check_generation_length, prompt_batch, prompt_ids

VOCAB = 50


def _to_tokens(text: str) -> list[int]:
    return [1 + ord(c) % (VOCAB - 1) for c in text]


IDS = st.integers(-3, VOCAB + 3)
INT_DTYPES = st.sampled_from([np.int8, np.int32, np.int64, np.uint8])
LEAVES = st.one_of(
    IDS,
    IDS.map(np.int64),
    IDS.map(torch.tensor),
    st.floats(-2, VOCAB) | st.just(float("nan")),
    st.booleans(),
    st.text(max_size=3),
    st.none(),
    st.complex_numbers(max_magnitude=5),
)
NESTED = st.recursive(LEAVES, lambda inner: st.lists(inner, max_size=4), max_leaves=10)
ARRAYS = st.one_of(
    st.tuples(st.lists(IDS, max_size=5), INT_DTYPES).map(
        lambda a: np.array(a[0]).astype(a[1]) if a[0] else np.array([], dtype=a[1])
    ),
    st.lists(st.lists(IDS, min_size=2, max_size=2), max_size=3).map(torch.tensor),
    st.lists(IDS, max_size=5).map(lambda x: torch.tensor(x, dtype=torch.float64)),
    st.lists(IDS, min_size=1, max_size=5).map(lambda x: torch.tensor([[x]])),
    st.lists(st.booleans(), min_size=1, max_size=3).map(torch.tensor),
)
ANYTHING = NESTED | ARRAYS


def _call(f, x):  # type: ignore[no-untyped-def]
    try:
        return f(x, _to_tokens, VOCAB), None
    except BadPromptError as exc:
        return None, exc


@settings(max_examples=500, deadline=None)
@given(ANYTHING)
def test_one_prompt_is_a_batch_of_that_prompt_and_errors_are_bad_prompt_errors(tokens) -> None:  # type: ignore[no-untyped-def]
    one, _ = _call(prompt_ids, tokens)  # any other exception fails the test
    batch, _ = _call(prompt_batch, tokens)
    if one is not None:
        assert batch == (one,)
        assert all(type(t) is int and 0 <= t < VOCAB for t in one)
    if batch is not None:
        assert all(rows and all(type(t) is int for t in rows) for rows in batch)


@pytest.mark.parametrize(
    "tokens",
    [[1, 2, 3], (1, 2, 3), np.array([1, 2, 3]), list(np.array([1, 2, 3])), torch.tensor([1, 2, 3])],
)
def test_every_spelling_of_one_prompt_is_the_same_prompt(tokens) -> None:  # type: ignore[no-untyped-def]
    assert prompt_ids(tokens, _to_tokens, VOCAB) == (1, 2, 3)
    assert prompt_batch(tokens, _to_tokens, VOCAB) == ((1, 2, 3),)


def test_lengths_are_checked_against_the_positions() -> None:
    with pytest.raises(PromptTooLongError, match="4 tokens but the model has 3 positions"):
        prompt_ids([1, 2, 3, 4], _to_tokens, VOCAB, max_positions=3)
    assert prompt_ids([1, 2, 3], _to_tokens, VOCAB, max_positions=3) == (1, 2, 3)
    check_generation_length(3, 1, 3)  # the last new token is never fed back
    with pytest.raises(PromptTooLongError, match="at most 1 new tokens"):
        check_generation_length(3, 2, 3)


def _encoder(adds_bos: bool, bos: int = 1):
    """A tokenizer's encode: the text's ids, with `bos` first when it adds one of its own."""

    def encode(text: str, special: bool) -> list[int]:
        ids = _to_tokens(text)
        return [bos, *ids] if special and adds_bos else ids

    return encode


def test_prepend_bos_true_puts_the_bos_first_whether_or_not_the_tokenizer_adds_one() -> None:
    """SmolLM2's tokenizer has a BOS (id 1) and adds none: `prepend_bos=True` added nothing."""
    from ie_core.prompts import text_ids

    body = _to_tokens("hello")
    for adds in (True, False):
        assert text_ids("hello", True, _encoder(adds), 1) == [1, *body]  # never two BOS
        assert text_ids("hello", False, _encoder(adds), 1) == body
    assert text_ids("hello", None, _encoder(True), 1) == [1, *body]  # the tokenizer's own
    assert text_ids("hello", None, _encoder(False), 1) == body


def test_prepend_bos_true_on_a_tokenizer_without_a_bos_is_refused() -> None:
    from ie_core.prompts import text_ids

    with pytest.raises(BadPromptError, match=r"has none \(no bos_token\).*prepend_bos=None"):
        text_ids("hello", True, _encoder(False), None)
    assert text_ids("hello", None, _encoder(False), None) == _to_tokens("hello")
    with pytest.raises(BadPromptError, match="True, False or None"):
        text_ids("hello", 1, _encoder(False), 1)  # type: ignore[arg-type]


def test_the_model_description_carries_the_bos_across_the_wire() -> None:
    from ie_core.model_info import ModelInfo

    info = ModelInfo(n_layers=2, d_model=8, bos_token_id=7)
    assert ModelInfo.from_wire(info.to_wire()) == info
    assert ModelInfo.from_wire({"n_layers": 2, "d_model": 8}).bos_token_id is None
