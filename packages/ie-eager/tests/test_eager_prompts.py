"""Prompts and sampling settings on the eager backend: one strict normaliser for capture and
generate, a named error for too-long prompts, SamplingParams checked at construction."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from eager_support import PROMPT, synthetic_model
from hypothesis import given, settings
from hypothesis import strategies as st
from ie_core.errors import BadPromptError, InterpError
from ie_core.protocol import SamplingParams
from ie_core.runner import run

ONE = SamplingParams(max_new_tokens=1, stop_at_eos=False)


def _resid(model, tokens) -> torch.Tensor:  # type: ignore[no-untyped-def]
    return run(model.capture(tokens, ["resid_post.1"]))["resid_post.1"]


def test_a_list_of_numpy_ids_is_one_prompt_for_capture_as_for_generate() -> None:
    model = synthetic_model("llama")
    ids = model.to_tokens(PROMPT)
    want = _resid(model, ids)
    for tokens in (list(np.array(ids)), list(torch.tensor(ids)), tuple(np.array(ids, np.int32))):
        got = _resid(model, tokens)
        assert got.shape == want.shape == (1, len(ids), model.d_model)
        assert torch.equal(got, want)
        assert run(model.generate(tokens, ONE)).prompt_ids == tuple(ids)


def test_batches_are_not_flattened_into_one_prompt() -> None:
    model = synthetic_model("llama")
    ids = model.to_tokens(PROMPT)
    with pytest.raises(BadPromptError, match=r"1-D.*pass one row"):
        run(model.generate(torch.tensor([ids, ids]), ONE))
    with pytest.raises(BadPromptError, match=r"2-D \[batch, seq\].*not flattened"):
        _resid(model, torch.tensor([[ids]]))
    # A 2-D batch is still a batch for capture: one row per prompt.
    assert _resid(model, torch.tensor([ids, ids])).shape[0] == 2


def test_float_token_ids_are_refused_not_truncated() -> None:
    model = synthetic_model("llama")
    ids = model.to_tokens(PROMPT)
    floats = [t + 0.7 for t in ids]
    with pytest.raises(BadPromptError, match="integers"):
        _resid(model, torch.tensor(floats))
    with pytest.raises(BadPromptError, match="integers"):
        run(model.generate(np.array(floats), ONE))
    with pytest.raises(BadPromptError, match="float"):
        run(model.generate(floats, ONE))
    with pytest.raises(BadPromptError, match="bool"):
        _resid(model, [True, *ids[1:]])


@pytest.mark.parametrize("slug", ["gpt2", "llama"])
def test_a_prompt_longer_than_the_positions_is_refused_naming_the_limit(slug: str) -> None:
    model = synthetic_model(slug)
    limit = 512  # the synthetic configs' n_positions (GPT-2) / max_position_embeddings
    too_long = [1] * (limit + 1)
    with pytest.raises(
        BadPromptError, match=f"{limit + 1} tokens but the model has {limit}"
    ) as info:
        _resid(model, too_long)
    assert type(info.value).__name__ == "PromptTooLongError"
    with pytest.raises(BadPromptError, match=f"has {limit} positions"):
        run(model.generate(too_long, ONE))
    # Prompt fits but the generation would run past the last position: say how many fit.
    with pytest.raises(BadPromptError, match="at most 3 new tokens"):
        run(model.generate([1] * (limit - 2), SamplingParams(max_new_tokens=20)))
    assert (
        len(run(model.generate([1] * (limit - 2), SamplingParams(3, stop_at_eos=False))).token_ids)
        == 3
    )
    assert _resid(model, [1] * limit).shape[1] == limit  # the limit itself is fine


@pytest.mark.parametrize(
    "fields",
    [
        {"max_new_tokens": 2.5},
        {"max_new_tokens": "3"},
        {"max_new_tokens": True},
        {"max_new_tokens": 0},
        {"temperature": float("nan")},
        {"temperature": "0.7"},
        {"temperature": -1.0},
        {"top_k": 2.0},
        {"top_p": float("nan")},
        {"top_p": 0.0},
        {"seed": 1.5},
        {"seed": -1},
        {"stop_at_eos": "no"},
    ],
)
def test_bad_sampling_params_are_named_errors_at_construction(fields: dict) -> None:
    with pytest.raises(InterpError) as info:
        SamplingParams(**fields)
    assert type(info.value).__name__ == "SamplingParamsError"
    assert next(iter(fields)) in str(info.value)


def test_sampling_params_of_the_wrong_type_are_refused() -> None:
    model = synthetic_model("llama")
    with pytest.raises(InterpError, match="SamplingParams"):
        run(model.generate(model.to_tokens(PROMPT), 5))  # type: ignore[arg-type]


# --- property: any accepted prompt means the same thing to capture and generate -------------

_IDS = st.integers(0, 255)
_PROMPT_LIKE = st.one_of(
    st.lists(_IDS, min_size=0, max_size=6),
    st.lists(_IDS, min_size=1, max_size=6).map(np.array),
    st.lists(_IDS, min_size=1, max_size=6).map(lambda x: list(np.array(x))),
    st.lists(_IDS, min_size=1, max_size=6).map(lambda x: list(torch.tensor(x))),
    st.lists(_IDS, min_size=1, max_size=6).map(torch.tensor),
    st.lists(st.lists(_IDS, min_size=3, max_size=3), min_size=1, max_size=2).map(torch.tensor),
    st.lists(st.lists(_IDS, min_size=3, max_size=3), min_size=1, max_size=2),
    st.lists(_IDS, min_size=1, max_size=6).map(lambda x: torch.tensor(x, dtype=torch.float32)),
    st.lists(st.floats(0, 255, allow_nan=False), min_size=1, max_size=4),
    st.lists(st.booleans(), min_size=1, max_size=3),
    st.lists(_IDS, min_size=1, max_size=4).map(lambda x: torch.tensor([[x]])),
    st.lists(_IDS | st.text(max_size=3), min_size=1, max_size=3),
    st.text(min_size=1, max_size=12),
    st.integers() | st.none() | st.floats(),
)


def _outcome(call):  # type: ignore[no-untyped-def]
    try:
        return call(), None
    except Exception as exc:
        return None, exc


@settings(max_examples=60, deadline=None)
@given(_PROMPT_LIKE)
def test_accepted_prompts_mean_the_same_to_capture_and_generate(tokens) -> None:  # type: ignore[no-untyped-def]
    model = synthetic_model("llama")
    generated, gen_error = _outcome(lambda: run(model.generate(tokens, ONE)))
    cache, cap_error = _outcome(lambda: _resid(model, tokens))
    for error in (gen_error, cap_error):
        assert error is None or isinstance(error, BadPromptError), repr(error)
    if generated is not None:
        # generate's one prompt is capture's batch of that one prompt.
        assert cache is not None
        assert torch.equal(cache, _resid(model, list(generated.prompt_ids)))
