"""A prompt whose input embeddings are given, at some positions or at all of them.

`EmbeddedPrompt(ids, {position: vector})` is token ids with the embedding row at each listed
position replaced by a vector; `from_embeddings(rows)` a prompt given whole as `[seq, d_model]`
rows. A vector is what the model's input-embedding module would output there (Hugging Face's
`inputs_embeds`), so it is written at the `embeddings` point, before positions or a scale the
model adds outside that module.

A plan lowers such a prompt to what every backend already runs: the ids, and a `Patch` at
`embeddings` on exactly the given positions, first among the prompt's steering. Eager, hooked
vLLM and a remote server then serve it as a token prompt (captures, steering, the lens), and the
width and finiteness of the vectors are checked where every write is, before any forward.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ie_core.errors import BadPromptError, SteeringSpecError
from ie_core.ops import Patch, PositionMask, Steering
from ie_core.ops.values import Vector, as_row

__all__ = [
    "EMBEDDINGS",
    "PLACEHOLDER_ID",
    "EmbeddedPrompt",
    "from_embeddings",
    "lowered",
]

EMBEDDINGS = "embeddings"  # the point a vector replaces: the input-embedding module's output
# The id a position given only as a vector carries (`from_embeddings`): any id in the vocabulary
# would do, since the vector replaces its embedding row before the first layer reads it.
PLACEHOLDER_ID = 0


@dataclass(frozen=True)
class EmbeddedPrompt:
    """Token `ids` (`Generation.prompt_ids` reports them) with the embedding row at each position
    of `vectors` replaced: `{position: [d_model] vector}`; a negative position counts from the
    end. Vectors are checked here (1-D, finite, one width); the width against the model when the
    request is admitted."""

    ids: tuple[int, ...]
    vectors: tuple[tuple[int, Vector], ...]

    def __init__(self, ids: Any, vectors: Mapping[int, Any] | Sequence[tuple[int, Any]]) -> None:
        object.__setattr__(self, "ids", _ids(ids))
        items = list(vectors.items()) if isinstance(vectors, Mapping) else list(vectors)
        object.__setattr__(self, "vectors", _vectors(items, len(self.ids)))

    @property
    def positions(self) -> tuple[int, ...]:
        return tuple(p for p, _ in self.vectors)

    def steering(self) -> Steering:
        """The write that puts the vectors in: a `Patch` at `embeddings` on their positions, all
        in the prompt, so no generated token is touched (no prefill-only scope, which vllm-static
        cannot run)."""
        patch = Patch([v for _, v in self.vectors], self.positions)
        return Steering(EMBEDDINGS, (), (patch,), PositionMask())

    def to_wire(self) -> dict[str, Any]:
        return {"ids": list(self.ids), "vectors": [[p, list(v)] for p, v in self.vectors]}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> EmbeddedPrompt:
        """`{"ids": [...], "vectors": [[position, [floats]], ...]}` (or `{"position": [...]}`)."""
        vectors = data.get("vectors")
        if isinstance(vectors, Mapping):
            vectors = [(_position_key(k), v) for k, v in vectors.items()]
        if not isinstance(vectors, list) or not all(
            isinstance(x, list | tuple) and len(x) == 2 for x in vectors
        ):
            raise BadPromptError(
                "an embedded prompt's 'vectors' is a list of [position, [floats]] pairs"
            )
        return cls(data.get("ids"), [(p, v) for p, v in vectors])


def from_embeddings(rows: Any) -> EmbeddedPrompt:
    """A prompt given whole as input embeddings `[seq, d_model]` (a tensor, array or lists); its
    ids are `PLACEHOLDER_ID` at every position."""
    ndim = getattr(rows, "ndim", None)
    if ndim is not None and ndim != 2:
        raise BadPromptError(
            f"input embeddings are [seq, d_model], got shape {tuple(getattr(rows, 'shape', ()))}"
        )
    listed = list(rows)
    if not listed:
        raise BadPromptError("the input embeddings are empty; give at least one row")
    return EmbeddedPrompt([PLACEHOLDER_ID] * len(listed), dict(enumerate(listed)))


def lowered(prompt: Any) -> tuple[Any, Steering | None]:
    """`prompt` as ids plus the write of its vectors, or `prompt` itself and None."""
    if isinstance(prompt, Mapping) and ("vectors" in prompt or "ids" in prompt):
        prompt = EmbeddedPrompt.from_wire(prompt)
    if isinstance(prompt, EmbeddedPrompt):
        return list(prompt.ids), prompt.steering()
    return prompt, None


def _ids(ids: Any) -> tuple[int, ...]:
    if isinstance(ids, str | bytes) or ids is None:
        raise BadPromptError(
            "an embedded prompt takes token ids, not text: tokenize first "
            "(EmbeddedPrompt(model.to_tokens(text), {position: vector}))"
        )
    values = ids.tolist() if hasattr(ids, "tolist") else list(ids)
    out = []
    for i, t in enumerate(values):
        if isinstance(t, bool) or not isinstance(t, numbers.Integral):
            raise BadPromptError(f"token id {i} is {type(t).__name__} {t!r}; ids are integers")
        out.append(int(t))
    if not out:
        raise BadPromptError("the prompt is empty; give at least one token")
    return tuple(out)


def _vectors(items: list[tuple[Any, Any]], n: int) -> tuple[tuple[int, Vector], ...]:
    if not items:
        raise BadPromptError("an embedded prompt needs at least one {position: vector}")
    out: dict[int, Vector] = {}
    for position, vector in items:
        if isinstance(position, bool) or not isinstance(position, numbers.Integral):
            raise BadPromptError(f"a vector's position is an int, got {position!r}")
        position = int(position)
        p = position + n if position < 0 else position
        if not 0 <= p < n:
            raise BadPromptError(
                f"position {position} is outside the prompt's {n} tokens (0..{n - 1})"
            )
        if p in out:
            raise BadPromptError(f"position {p} is given two vectors")
        try:
            out[p] = as_row(vector, f"the vector at position {p}")
        except SteeringSpecError as exc:  # the same words, as the prompt error it is here
            raise BadPromptError(str(exc)) from None
    widths = {len(v) for v in out.values()}
    if len(widths) > 1:
        raise BadPromptError(f"the vectors have different widths {sorted(widths)}; give d_model")
    return tuple(sorted(out.items()))


def _position_key(key: Any) -> int:
    try:
        return int(key)
    except (TypeError, ValueError):
        raise BadPromptError(f"a vector's position is an int, got {key!r}") from None
