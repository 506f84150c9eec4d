"""Reading a hidden state as text: Patchscopes (arXiv 2401.06102) and SelfIE (arXiv 2403.10949).

A read takes the state at one point, layer and position of a source prompt, writes it over the
state of a target prompt's placeholder token(s) at a target layer (a `Patch`), and lets the model
generate from there. Each read is a GENERATE `Plan` (`patchscope_plans` builds them; the readers
run them through the protocol's `generate`), so every backend serves it, a remote one included.
The readers send all of a prompt's reads at once (one capture for the source states, then every
generation together: one batch of requests on vLLM, where concurrent requests share forwards).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ie_core.errors import BadPromptError
from ie_core.ops import Patch, PositionMask, Steering
from ie_core.plan import GENERATE, Plan
from ie_core.protocol import SamplingParams
from ie_core.runner import run
from ie_core.sync import ModelLike, unwrap
from ie_core.wire import sampling_from_wire

__all__ = [
    "ENTITY_DESCRIPTION",
    "IDENTITY",
    "SELFIE",
    "PatchscopeRead",
    "Target",
    "patchscope",
    "patchscope_plans",
    "read_patchscopes",
    "reads_from_wire",
    "selfie",
    "source_states",
]

HOLE = 0  # where a target's placeholder token stands (SelfIE's notation for its prompt tuples)


@dataclass(frozen=True)
class Target:
    """A target prompt: text parts, and `HOLE` (0) where a placeholder token takes the source
    state; `placeholder` is the text standing there."""

    parts: tuple[str | int, ...]
    placeholder: str

    def __post_init__(self) -> None:
        if not any(p == HOLE and not isinstance(p, str) for p in self.parts):
            raise BadPromptError("a target prompt needs at least one placeholder (0) in its parts")
        if not isinstance(self.parts[0], str):
            raise BadPromptError("a target prompt starts with text, before its first placeholder")

    def ids(self, model: Any) -> tuple[list[int], tuple[int, ...]]:
        """The target's token ids on `model` and the positions of its placeholders: each the
        last token of `placeholder`'s text (" ?" is one token on most BPE vocabularies; where
        it is two, the state goes on the "?")."""
        hole = model.to_tokens(self.placeholder, prepend_bos=False)
        if not hole:
            raise BadPromptError(f"the placeholder {self.placeholder!r} has no tokens")
        ids: list[int] = []
        holes: list[int] = []
        for i, part in enumerate(self.parts):
            if isinstance(part, str):
                ids += model.to_tokens(part, prepend_bos=None if i == 0 else False)
            else:
                ids += hole
                holes.append(len(ids) - 1)
        return ids, tuple(holes)


# Patchscopes' identity prompt (its section 4.1, next-token decoding): the model repeats what it
# is shown, so the continuation at the placeholder says which token the state stands for.
IDENTITY = Target(("cat->cat; 1135->1135; hello->hello;", HOLE), " ?")
# Patchscopes' few-shot entity-description prompt (its section 4.4, entity resolution).
ENTITY_DESCRIPTION = Target(
    (
        "Syria: Country in the Middle East, Leonardo DiCaprio: American actor, Samsung: South "
        "Korean multinational major appliance and consumer electronics corporation,",
        HOLE,
    ),
    " x",
)
# SelfIE's interpretation prompt: five placeholders, each given the same state.
SELFIE = Target(
    ("[INST]", HOLE, HOLE, HOLE, HOLE, HOLE, "[/INST] Sure, I will summarize the message:"), " _"
)


PRESETS = {"identity": IDENTITY, "entity_description": ENTITY_DESCRIPTION, "selfie": SELFIE}


@dataclass(frozen=True)
class PatchscopeRead:
    """One read: the source layer, the target layer it was written at, and what was generated."""

    layer: int
    target_layer: int
    token_ids: tuple[int, ...]
    text: str


def patchscope_plans(
    states: Sequence[Any],
    target_ids: Sequence[int],
    holes: Sequence[int],
    target_layers: Sequence[int],
    *,
    point: str = "resid_post",
    sampling: SamplingParams | None = None,
) -> list[Plan]:
    """One GENERATE plan per (state, target layer): the target prompt with `state` written over
    each placeholder's row at `point.target_layer` (prompt positions: generated rows are
    untouched)."""
    if len(states) != len(target_layers):
        raise ValueError(f"{len(states)} states but {len(target_layers)} target layers")
    params = sampling or SamplingParams(max_new_tokens=10)
    plans = []
    for state, layer in zip(states, target_layers, strict=True):
        patch = Patch(state, tuple(holes))
        write = Steering(point, (layer,), (patch,), PositionMask())
        plans.append(Plan(GENERATE, list(target_ids), (), (write,), params))
    return plans


async def source_states(
    model: ModelLike, source: Any, position: int, layers: Sequence[int], point: str = "resid_post"
) -> list[Any]:
    """The source prompt's rows `[width]` at `position` and `point.layer`, one capture for all."""
    model = unwrap(model)
    addresses = [f"{point}.{layer}" for layer in layers]
    cache = await model.capture([source], addresses)
    rows = [cache[a][0] for a in addresses]
    n = rows[0].shape[0]
    if not -n <= position < n:
        raise BadPromptError(f"position {position} is outside the source prompt's {n} tokens")
    return [r[position] for r in rows]


async def read_patchscopes(
    model: ModelLike,
    source: Any,
    position: int,
    layers: Sequence[int] | None = None,
    target: Target = IDENTITY,
    *,
    target_layer: int | None = None,
    point: str = "resid_post",
    sampling: SamplingParams | None = None,
) -> list[PatchscopeRead]:
    """Read the state at `position` of `source` at each of `layers` (default every layer)
    through `target`, written at `target_layer` (default: the source layer, as the paper's
    same-layer patchscope); every read in flight at once."""
    model = unwrap(model)
    chosen = list(range(model.n_layers)) if layers is None else list(layers)
    targets = [layer if target_layer is None else target_layer for layer in chosen]
    states = await source_states(model, source, position, chosen, point)
    ids, holes = target.ids(model)
    plans = patchscope_plans(states, ids, holes, targets, point=point, sampling=sampling)
    # Each plan through the protocol's generate, which makes the same plan on every backend.
    done = await asyncio.gather(
        *(
            model.generate(p.prompt, p.sampling or SamplingParams(), steering=p.steering)
            for p in plans
        )
    )
    return [
        PatchscopeRead(layer, at, tuple(g.token_ids), g.text)
        for layer, at, g in zip(chosen, targets, done, strict=True)
    ]


def patchscope(
    model: ModelLike,
    source: Any,
    layer: int,
    position: int,
    target: Target = IDENTITY,
    *,
    target_layer: int | None = None,
    point: str = "resid_post",
    sampling: SamplingParams | None = None,
) -> PatchscopeRead:
    """One patchscope read: the state at `point.layer`, `position` of `source`, written over
    `target`'s placeholder at `target_layer` (default `layer`), then generation."""
    (read,) = run(
        read_patchscopes(
            model, source, position, [layer], target,
            target_layer=target_layer, point=point, sampling=sampling,
        )
    )  # fmt: skip
    return read


def selfie(
    model: ModelLike,
    source: Any,
    position: int,
    layers: Sequence[int] | None = None,
    *,
    k: int = 1,
    sampling: SamplingParams | None = None,
) -> list[PatchscopeRead]:
    """SelfIE's read of `source`'s state at `position` at each of `layers` (default all): the
    state written over the five placeholders of its interpretation prompt after layer `k`
    (`resid_post.k`; 1 is the value its reference code shows)."""
    return run(
        read_patchscopes(model, source, position, layers, SELFIE, target_layer=k,
                         sampling=sampling)
    )  # fmt: skip


def reads_from_wire(data: Any) -> dict[str, Any]:
    """`read_patchscopes`' arguments from a JSON body (`POST /v1/ie/patchscope`): `source` (a
    prompt), `position`, optional `layers`, `target` (a preset's name or `{"parts": [...],
    "placeholder": "..."}`), `target_layer`, `point` and `sampling`."""
    if not isinstance(data, dict):
        raise BadPromptError("the request body must be a JSON object")
    if "source" not in data or not isinstance(data.get("position"), int):
        raise BadPromptError(
            "a patchscope request needs 'source' (a prompt) and 'position' (an int)"
        )
    layers = data.get("layers")
    if layers is not None and not (
        isinstance(layers, list) and all(isinstance(x, int) for x in layers)
    ):
        raise BadPromptError("'layers' is a list of ints, or absent for every layer")
    target_layer = data.get("target_layer")
    if target_layer is not None and not isinstance(target_layer, int):
        raise BadPromptError("'target_layer' is an int, or absent for the source layer")
    return {
        "source": data["source"],
        "position": data["position"],
        "layers": layers,
        "target": _target(data.get("target", "identity")),
        "target_layer": target_layer,
        "point": str(data.get("point", "resid_post")),
        "sampling": sampling_from_wire(data.get("sampling")),
    }


def _target(value: Any) -> Target:
    if isinstance(value, str):
        if value not in PRESETS:
            raise BadPromptError(f"unknown target {value!r}; presets: {', '.join(PRESETS)}")
        return PRESETS[value]
    parts = value.get("parts") if isinstance(value, dict) else None
    if isinstance(parts, list) and all(isinstance(p, str) or p == HOLE for p in parts):
        return Target(tuple(parts), str(value.get("placeholder", " ?")))
    raise BadPromptError(
        "'target' is a preset's name or {'parts': [text or 0, ...], 'placeholder': '...'}"
    )
