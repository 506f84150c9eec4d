"""The one prompt normaliser every backend uses, for capture and generate alike.

A prompt is text or a 1-D run of integer token ids (a list or tuple of ints or numpy / 0-d tensor
integers, or a 1-D integer array or tensor). A batch is a 2-D integer array or tensor, or a list
of prompts. Anything else is refused with `BadPromptError`, never coerced: floats are not
truncated, a 2-D tensor is not flattened into one prompt, bools are not ids.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from typing import Any

from ie_core.errors import BadPromptError, PromptTooLongError

Prompt = str | Sequence[int]
ToTokens = Callable[[str], list[int]]
Encode = Callable[[str, bool], Sequence[int]]  # (text, add_special_tokens) -> ids

_INT_DTYPES = frozenset(f"{sign}int{bits}" for sign in ("", "u") for bits in (8, 16, 32, 64))


def _dtype_name(values: Any) -> str:
    return str(getattr(values, "dtype", "")).removeprefix("torch.")


def _token(x: Any) -> int | None:
    """`x` as one token id when it is one integer (Python, numpy, 0-d tensor), else None."""
    if isinstance(x, bool):
        return None
    if isinstance(x, numbers.Integral):
        return int(x)
    if getattr(x, "ndim", None) == 0 and _dtype_name(x) in _INT_DTYPES:
        return int(x.item())
    return None


def _describe(x: Any) -> str:
    shape = getattr(x, "shape", None)
    if shape is not None:
        return f"{type(x).__name__} of dtype {_dtype_name(x)} and shape {tuple(shape)}"
    return f"{type(x).__name__} {x!r}"[:80]


def _ids(tokens: Any) -> tuple[int, ...]:
    """One prompt of ids (not text), strictly typed."""
    ndim = getattr(tokens, "ndim", None)
    if ndim is not None:
        if ndim != 1:
            hint = "; this is a batch, pass one row (tokens[0])" if ndim == 2 else ""
            raise BadPromptError(f"a prompt of ids is 1-D, got {_describe(tokens)}{hint}")
        if _dtype_name(tokens) not in _INT_DTYPES:
            raise BadPromptError(
                f"token ids must be integers, got {_describe(tokens)}; ids are not rounded, "
                "convert them with .long() / .astype(int) if they are whole numbers"
            )
        return tuple(int(t) for t in tokens.tolist())
    if isinstance(tokens, str | bytes) or not isinstance(tokens, Sequence):
        raise BadPromptError(
            f"a prompt is a string or a sequence of integer token ids, got {_describe(tokens)}"
        )
    ids = []
    for i, x in enumerate(tokens):
        t = _token(x)
        if t is None:
            raise BadPromptError(
                f"token id {i} is {_describe(x)}; a prompt of ids holds integers only (no "
                "floats, bools or nested lists; a batch goes to capture, not generate)"
            )
        ids.append(t)
    return tuple(ids)


def text_ids(
    text: Any, prepend_bos: bool | None, encode: Encode, bos_token_id: int | None
) -> list[int]:
    """A text's ids, every backend's `to_tokens`: `prepend_bos=None` (the default) gives the
    tokenizer's own special tokens, as the model is served; `True` the tokenizer's BOS and then
    the text without special tokens, as TransformerLens does (SmolLM2's tokenizer adds no BOS of
    its own); `False` no special tokens. A tokenizer without a BOS token refuses `True`."""
    if not isinstance(text, str):
        raise BadPromptError(f"to_tokens takes a string, got {type(text).__name__}")
    if prepend_bos is not None and not isinstance(prepend_bos, bool):
        raise BadPromptError(f"prepend_bos is True, False or None, got {prepend_bos!r}")
    if prepend_bos is None:
        return [int(t) for t in encode(text, True)]
    ids = [int(t) for t in encode(text, False)]
    if not prepend_bos:
        return ids
    if bos_token_id is None:
        raise BadPromptError(
            "prepend_bos=True asks for the tokenizer's BOS token, but this tokenizer has none "
            "(no bos_token), so there is nothing to prepend; use prepend_bos=None for the "
            "tokenizer's own special tokens, or prepend the id you want to the ids yourself"
        )
    return [int(bos_token_id), *ids]


def tokenizer_ids(tokenizer: Any, text: Any, prepend_bos: bool | None) -> list[int]:
    """`text_ids` with a Hugging Face tokenizer (the eager and vLLM backends' `to_tokens`)."""
    return text_ids(
        text,
        prepend_bos,
        lambda t, s: tokenizer(t, add_special_tokens=s)["input_ids"],
        tokenizer.bos_token_id,
    )


def prompt_ids(
    tokens: Any,
    to_tokens: ToTokens,
    vocab_size: int,
    max_positions: int | None = None,
) -> tuple[int, ...]:
    """One prompt as token ids: text goes through `to_tokens`; ids are checked to be integers
    inside the vocabulary, and the prompt to fit `max_positions` when the model has a limit."""
    ids = tuple(to_tokens(tokens)) if isinstance(tokens, str) else _ids(tokens)
    if not ids:
        raise BadPromptError("the prompt is empty; give at least one token")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise BadPromptError(
            f"token ids {bad[:5]} are outside the vocabulary (0..{vocab_size - 1})"
        )
    if max_positions is not None and len(ids) > max_positions:
        raise PromptTooLongError(
            f"the prompt has {len(ids)} tokens but the model has {max_positions} positions; "
            f"shorten it to at most {max_positions} tokens"
        )
    return ids


def prompt_batch(
    tokens: Any,
    to_tokens: ToTokens,
    vocab_size: int,
    max_positions: int | None = None,
) -> tuple[tuple[int, ...], ...]:
    """One or more prompts: whatever `prompt_ids` accepts is a batch of that one prompt; a 2-D
    integer array / tensor or a list of prompts is a batch of its rows."""

    def one(x: Any) -> tuple[int, ...]:
        return prompt_ids(x, to_tokens, vocab_size, max_positions)

    ndim = getattr(tokens, "ndim", None)
    if ndim == 2:
        if _dtype_name(tokens) not in _INT_DTYPES:
            raise BadPromptError(f"token ids must be integers, got {_describe(tokens)}")
        if len(tokens) == 0:
            raise BadPromptError("the batch is empty; give at least one prompt")
        return tuple(one(row) for row in tokens)
    if ndim is not None and ndim != 1:
        raise BadPromptError(
            f"a batch of ids is 2-D [batch, seq], got {_describe(tokens)}; it is not flattened"
        )
    if ndim is not None or isinstance(tokens, str) or not isinstance(tokens, Sequence):
        return (one(tokens),)
    if len(tokens) == 0:
        raise BadPromptError("the prompt is empty; give at least one token")
    if all(_is_prompt(x) for x in tokens):
        return tuple(one(x) for x in tokens)
    if any(_is_prompt(x) for x in tokens) and any(_token(x) is not None for x in tokens):
        raise BadPromptError(
            "the input mixes token ids with prompts; give one prompt (ids only) or a batch "
            "(a list of prompts)"
        )
    return (one(tokens),)  # ids, or a bad id that `prompt_ids` names


def _is_prompt(x: Any) -> bool:
    """Whether `x` is shaped like one prompt (text, a sequence, an array of 1 or more dims)."""
    if getattr(x, "ndim", 0):
        return True
    return isinstance(x, str) or (isinstance(x, Sequence) and not isinstance(x, bytes))


def position_limit(config: Any) -> int | None:
    """The positions a model can attend over, from its HF config (None when it states none)."""
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def check_generation_length(n_prompt: int, max_new_tokens: int, limit: int | None) -> None:
    """Refuse a generation whose forwards would run past the model's last position (the last
    new token is sampled, never fed back, so prompt + max_new_tokens - 1 positions are used)."""
    if limit is None:
        return
    used = n_prompt + max_new_tokens - 1
    if used > limit:
        room = limit - n_prompt + 1
        raise PromptTooLongError(
            f"a {n_prompt}-token prompt plus {max_new_tokens} new tokens needs {used} positions "
            f"but the model has {limit}; ask for at most {room} new tokens or shorten the prompt"
        )
