"""Activation patching on any backend: metrics of the final logits, mean activations, and sweeps.

A sweep is many independent requests, one per cell, each the corrupt prompt with one `Patch` from
the clean run; they are all in flight together, so vLLM batches them (eager runs them in turn).
Each cell's final logits come from its last-layer residual row through the backend's own lens
(`decode_residuals`: final norm, unembed, the family's multiplier and softcap), so only
`[d_model]` per cell leaves a vLLM worker before the decode. Importing this module imports torch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ie_core.errors import BadPromptError, SteeringSpecError
from ie_core.grammar import Width, get_point, point_name, to_address
from ie_core.ops import Patch, PositionMask, Steering
from ie_core.protocol import InterpModel, Prompt, SteeringArg
from ie_core.runner import run
from ie_core.sync import ModelLike, unwrap

TokenLike = int | str | Sequence[int]
# Cells decoded per lens call: bounds the [cells, vocab] logits held at once.
DECODE_CHUNK = 64
# Requests on one prompt captured per call: bounds one batched forward's activations on eager.
BATCH_CELLS = 64
# How clean positions pair with corrupt ones: "start", "end", or (clean, corrupt) pairs.
Align = str | Sequence[tuple[int, int]]


@dataclass(frozen=True)
class Metric:
    """A function of the final-position logits: `fn(logits [n, vocab] fp32, ids) -> [n]`, where
    `ids` are `tokens` as token ids (a string token must then be exactly one token).

    Answers of several tokens need `seq_fn(logprobs [n, len(tokens)]) -> [n]`: column i is token
    i's summed teacher-forced log-probability, sum_j log p(a_j | prompt, a_<j) (see
    `answer_logprobs`). `fn` scores when every answer is one token, `seq_fn` otherwise; a metric
    without `seq_fn` refuses multi-token answers.

    `token_fn(selected [n, len(tokens)], lse [n]) -> [n]`, where it exists, is the same metric
    from the answer tokens' logits and the logsumexp over the vocabulary alone: every backend
    reduces the final logits where they live (`final_token_logits`, the `TokenLogits` reducer)
    and returns these numbers per cell instead of `[vocab]` logits."""

    name: str
    fn: Callable[[torch.Tensor, tuple[int, ...]], torch.Tensor]
    tokens: tuple[TokenLike, ...] = ()
    seq_fn: Callable[[torch.Tensor], torch.Tensor] | None = None
    token_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None

    def token_ids(self, model: Any) -> tuple[int, ...]:
        return tuple(single_token(model, t) for t in self.tokens)

    def answer_ids(self, model: Any) -> tuple[tuple[int, ...], ...]:
        """Every token as its full id sequence; refused where one has several and there is no
        `seq_fn` to score them."""
        answers = tuple(answer_tokens(model, t) for t in self.tokens)
        if self.seq_fn is None and any(len(a) != 1 for a in answers):
            self.token_ids(model)  # raises, naming the token
        return answers


def answer_tokens(model: Any, token: TokenLike) -> tuple[int, ...]:
    """A token-like as ids: an int id, a string's ids (without BOS), or a sequence of int ids."""
    if isinstance(token, bool):
        raise SteeringSpecError(f"a metric token is an int id or a string, got {token!r}")
    if isinstance(token, int):
        return (token,)
    if isinstance(token, str):
        ids = tuple(int(i) for i in model.to_tokens(token, prepend_bos=False))
    elif isinstance(token, Sequence) and all(
        isinstance(i, int) and not isinstance(i, bool) for i in token
    ):
        ids = tuple(token)
    else:
        raise SteeringSpecError(
            f"a metric token is an int id, a string or a sequence of int ids, got {token!r}"
        )
    if not ids:
        raise SteeringSpecError(f"{token!r} encodes to no tokens; a metric answer needs one")
    return ids


def single_token(model: Any, token: TokenLike) -> int:
    """A token id, or the one id a string encodes to (without BOS); anything else is refused."""
    if isinstance(token, bool) or not isinstance(token, int | str):
        raise SteeringSpecError(f"a metric token is an int id or a string, got {token!r}")
    if isinstance(token, int):
        return token
    ids = model.to_tokens(token, prepend_bos=False)
    if len(ids) != 1:
        raise SteeringSpecError(
            f"{token!r} is {len(ids)} tokens {list(ids)} on this tokenizer; this metric scores "
            "one token: pass its id, or a string that encodes to one (mind a leading space). "
            "patch_sweep's logit_diff and answer_prob (or a Metric with seq_fn) score "
            "multi-token answers by their summed log-probabilities"
        )
    return int(ids[0])


def logit_diff(answer: TokenLike, wrong: TokenLike) -> Metric:
    """logit[answer] - logit[wrong] at the last position (equal to the log-prob difference).

    Where either answer is several tokens (`patch_sweep`), it is the difference of the answers'
    summed teacher-forced log-probabilities, log p(answer | prompt) - log p(wrong | prompt), each
    the sum over its tokens of log p(token | prompt, earlier answer tokens); a one-token answer
    contributes its log-probability. With both answers one token it stays the logit difference
    (the same value up to rounding)."""
    return Metric(
        "logit_diff",
        lambda logits, ids: logits[:, ids[0]] - logits[:, ids[1]],
        (answer, wrong),
        seq_fn=lambda lp: lp[:, 0] - lp[:, 1],
        token_fn=lambda selected, lse: selected[:, 0] - selected[:, 1],
    )


def answer_prob(answer: TokenLike) -> Metric:
    """softmax(logits)[answer] at the last position, from an fp32 logsumexp over the vocab.

    A multi-token answer (`patch_sweep`) scores its whole probability, exp of the sum over its
    tokens of log p(token | prompt, earlier answer tokens) (teacher forcing)."""
    return Metric(
        "answer_prob",
        lambda logits, ids: torch.exp(logits[:, ids[0]] - torch.logsumexp(logits, dim=-1)),
        (answer,),
        seq_fn=lambda lp: torch.exp(lp[:, 0]),
        token_fn=lambda selected, lse: torch.exp(selected[:, 0] - lse),
    )


@dataclass(frozen=True)
class SweepResult:
    """`values[i, j]`: the metric of the corrupt run patched at `rows[i]` (a layer) and `cols[j]`
    (a position, or a head for per-head points), beside the unpatched clean and corrupt runs."""

    point: str
    rows: tuple[int, ...]
    cols: tuple[int, ...]
    col_kind: str  # "position" | "head"
    values: torch.Tensor = field(compare=False)
    clean: float
    corrupt: float
    # The clean position patched into each corrupt position of `cols` (position sweeps); it
    # differs from `cols` only under `align=` (prompts of different lengths).
    sources: tuple[int, ...] = ()

    def normalized(self) -> torch.Tensor:
        """(values - corrupt) / (clean - corrupt): 1 where the patch restores the clean answer."""
        span = self.clean - self.corrupt
        if span == 0:
            raise ValueError("the clean and corrupt runs score the same; nothing to normalize")
        return (self.values - self.corrupt) / span


async def final_logits(
    model: ModelLike, prompts: Sequence[Prompt], steerings: Sequence[SteeringArg]
) -> torch.Tensor:
    """`[n, vocab]` fp32 logits at the last position of each (prompt, steering) request; the
    model's own lens turns the last residual row into logits.

    Requests on the same prompt run as one capture of up to `BATCH_CELLS` rows, each row with its
    own steering (`row_steering`): one batched forward on eager, requests in flight together on
    vLLM, one HTTP request on remote."""
    model = unwrap(model)
    last = f"resid_post.{model.n_layers - 1}"
    ids = [tuple(prompt_token_ids(model, p)) for p in prompts]
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, key in enumerate(ids):
        groups.setdefault(key, []).append(i)
    chunks = [
        (key, members[lo : lo + BATCH_CELLS])
        for key, members in groups.items()
        for lo in range(0, len(members), BATCH_CELLS)
    ]

    async def batch(key: tuple[int, ...], members: list[int]) -> torch.Tensor:
        rows = [steerings[i] for i in members]
        cache = await model.capture([list(key)] * len(members), [last], row_steering=rows)
        return cache[last][:, -1]

    parts = await asyncio.gather(*(batch(key, members) for key, members in chunks))
    order = [i for _, members in chunks for i in members]
    stacked = torch.cat(list(parts))
    rows = torch.empty_like(stacked)
    rows[torch.tensor(order, device=stacked.device)] = stacked
    return await decode_rows(model, rows)


async def decode_rows(model: ModelLike, rows: torch.Tensor) -> torch.Tensor:
    """`[n, vocab]` fp32 logits of residual rows `[n, d_model]` through the model's lens,
    `DECODE_CHUNK` rows per call."""
    model = unwrap(model)
    parts = [
        await model.decode_residuals(rows[i : i + DECODE_CHUNK])
        for i in range(0, rows.shape[0], DECODE_CHUNK)
    ]
    return torch.cat(parts).float()


async def answer_logprobs(
    model: ModelLike,
    prompts: Sequence[Sequence[int]],
    steerings: Sequence[Steering | None],
    answers: Sequence[Sequence[int]],
) -> torch.Tensor:
    """`[n, len(answers)]` fp32: each answer's summed teacher-forced log-probability after each
    (prompt, steering) request, sum_j log p(a_j | prompt, a_<j).

    Every request runs once per distinct answer prefix (the answer less its last token) appended
    to the prompt, and the last `len(answer)` positions' logits are read; the steering is applied
    as given, so its positions refer to the prompt part. Log-softmax is fp32, `DECODE_CHUNK` rows
    at a time, keeping only the answers' entries."""
    model = unwrap(model)
    last = f"resid_post.{model.n_layers - 1}"
    answers = [tuple(int(t) for t in a) for a in answers]
    prefixes = sorted({a[:-1] for a in answers}, key=lambda c: (len(c), c))

    async def tail(prompt: Sequence[int], prefix: tuple[int, ...], steering: Any) -> torch.Tensor:
        cache = await model.capture([[*prompt, *prefix]], [last], steering=steering)
        return cache[last][0, -(len(prefix) + 1) :]

    jobs = [(r, c) for r in range(len(prompts)) for c in prefixes]
    tails = await asyncio.gather(*(tail(prompts[r], c, steerings[r]) for r, c in jobs))
    first: dict[tuple[int, tuple[int, ...]], int] = {}
    offset = 0
    for job, t in zip(jobs, tails, strict=True):
        first[job] = offset
        offset += int(t.shape[0])
    rows_idx, toks, dest = [], [], []
    for r in range(len(prompts)):
        for i, a in enumerate(answers):
            start = first[(r, a[:-1])]
            for j, token in enumerate(a):
                rows_idx.append(start + j)
                toks.append(token)
                dest.append(r * len(answers) + i)
    rows = torch.cat(list(tails))
    row_t, tok_t, dest_t = (torch.tensor(x, dtype=torch.long) for x in (rows_idx, toks, dest))
    out = torch.zeros(len(prompts) * len(answers), dtype=torch.float32)
    for lo in range(0, rows.shape[0], DECODE_CHUNK):
        hi = min(lo + DECODE_CHUNK, rows.shape[0])
        logits = (await model.decode_residuals(rows[lo:hi])).float()
        lp = torch.log_softmax(logits, dim=-1).cpu()
        pick = (row_t >= lo) & (row_t < hi)
        out.index_add_(0, dest_t[pick], lp[row_t[pick] - lo, tok_t[pick]])
    return out.reshape(len(prompts), len(answers))


def align_positions(n_clean: int, n_corrupt: int, align: Align | None) -> dict[int, int]:
    """{corrupt position: clean position} for prompts of `n_clean` and `n_corrupt` tokens.

    `None` needs equal lengths (position i pairs with i); `"start"` pairs i with i over the
    shorter length, `"end"` pairs positions counted from the end (the last with the last); a
    sequence of `(clean, corrupt)` pairs is used as given. Positions of one prompt without a
    partner in the other are not in the map."""
    if align is None:
        if n_clean != n_corrupt:
            raise BadPromptError(
                f"clean and corrupt prompts have {n_clean} and {n_corrupt} tokens; patching pairs "
                'positions: give align="end" (positions counted from the end pair, for prompts '
                'that differ before a shared ending), align="start", or align=[(clean_position, '
                "corrupt_position), ...]"
            )
        return {i: i for i in range(n_corrupt)}
    if align == "start":
        return {i: i for i in range(min(n_clean, n_corrupt))}
    if align == "end":
        k = min(n_clean, n_corrupt)
        return {n_corrupt - k + i: n_clean - k + i for i in range(k)}
    if isinstance(align, str):
        raise SteeringSpecError(f'align is "start", "end" or (clean, corrupt) pairs, got {align!r}')
    mapping: dict[int, int] = {}
    for pair in align:
        if (
            not isinstance(pair, Sequence)
            or len(pair) != 2
            or not all(isinstance(p, int) and not isinstance(p, bool) for p in pair)
        ):
            raise SteeringSpecError(
                f"align pairs are (clean_position, corrupt_position), got {pair!r}"
            )
        c, k = pair
        if not (0 <= c < n_clean and 0 <= k < n_corrupt):
            raise SteeringSpecError(
                f"align pair {tuple(pair)} is outside the prompts (clean positions 0..{n_clean - 1}, "
                f"corrupt positions 0..{n_corrupt - 1})"
            )
        if k in mapping:
            raise SteeringSpecError(f"align pairs corrupt position {k} twice")
        mapping[k] = c
    if not mapping:
        raise SteeringSpecError("align has no pairs")
    return dict(sorted(mapping.items()))


def prompt_token_ids(model: ModelLike, prompt: Prompt) -> list[int]:
    """One prompt's token ids: a string through the model's tokenizer, else the ids as ints."""
    if isinstance(prompt, str):
        return list(unwrap(model).to_tokens(prompt))
    return [int(t) for t in prompt]


async def mean_activation_async(
    model: ModelLike,
    prompts: Sequence[Prompt],
    address: str,
    positions: Sequence[int] | None = None,
) -> torch.Tensor:
    """The mean `[width]` row of `address` over `prompts` (and `positions`, default all): the
    value a mean ablation writes with `Patch(mean)`."""
    model = unwrap(model)
    address = str(to_address(address, check=True))
    if not prompts:
        raise BadPromptError("mean_activation needs at least one prompt")

    async def rows(prompt: Prompt) -> torch.Tensor:
        t = (await model.capture([prompt_token_ids(model, prompt)], [address]))[address][0]
        return t if positions is None else t[list(positions)]

    return torch.cat(await asyncio.gather(*(rows(p) for p in prompts))).float().mean(0)


def mean_activation(
    model: ModelLike,
    prompts: Sequence[Prompt],
    address: str,
    positions: Sequence[int] | None = None,
) -> torch.Tensor:
    return run(mean_activation_async(unwrap(model), prompts, address, positions))


def _cells(
    point: str, layers: Sequence[int], cols: Sequence[int], per_head: bool
) -> list[tuple[int, int]]:
    if per_head and get_point(point).width not in (Width.H, Width.KV):
        raise SteeringSpecError(f"{point} is not a per-head point")
    return [(layer, c) for layer in layers for c in cols]


async def head_count(model: InterpModel, point: str, layer: int, prompt: list[int]) -> int:
    """Heads of a per-head point: the query heads (from attn_probs), scaled for KV-wide points."""
    probs = (await model.capture([prompt], [f"attn_probs.{layer}"]))[f"attn_probs.{layer}"]
    heads = int(probs.shape[1])
    if get_point(point).width == Width.KV:
        z, v = model.point_width(f"z.{layer}"), model.point_width(f"{point}.{layer}")
        heads = heads * v // z
    return heads


async def patch_sweep_async(
    model: ModelLike,
    clean: Prompt,
    corrupt: Prompt,
    *,
    metric: Metric,
    point: str = "resid_pre",
    layers: Sequence[int] | None = None,
    positions: Sequence[int] | None = None,
    heads: bool = False,
    align: Align | None = None,
) -> SweepResult:
    """Patch the clean run's `point` into the corrupt run, one cell per (layer, position), or per
    (layer, head) with `heads=True` (every position of that head patched); see `SweepResult`.
    `point` is our name or a TransformerLens / nnterp one (`hook_resid_pre`, `attn.hook_z`).

    Prompts of different lengths need `align` (`align_positions`): `"end"`, `"start"` or
    `(clean, corrupt)` pairs. `positions` are corrupt positions; by default every one with a
    clean partner (the others are skipped; `SweepResult.sources` names each cell's clean
    position), and a listed one without a partner is refused. `heads=True` needs every corrupt
    position paired. A metric answer of several tokens is scored by teacher forcing
    (`answer_logprobs`): its tokens but the last are appended to every run, unpatched, and the
    patches stay at the prompt positions."""
    model = unwrap(model)
    point = point_name(point)
    clean_ids, corrupt_ids = prompt_token_ids(model, clean), prompt_token_ids(model, corrupt)
    pairs = align_positions(len(clean_ids), len(corrupt_ids), align)
    layers = tuple(range(model.n_layers) if layers is None else layers)
    answers = metric.answer_ids(model)
    if heads:
        unpaired = [p for p in range(len(corrupt_ids)) if p not in pairs]
        if unpaired:
            raise BadPromptError(
                f"heads=True patches a head at every corrupt position, but corrupt positions "
                f"{unpaired} have no clean partner under align={align!r}; pair every one"
            )
        n_heads = await head_count(model, point, layers[0], corrupt_ids)
        cols = tuple(range(n_heads))
    elif positions is None:
        cols = tuple(pairs)
    else:
        cols = tuple(int(p) for p in positions)
        lone = [p for p in cols if p not in pairs]
        if lone:
            raise BadPromptError(
                f"corrupt positions {lone} have no clean partner (corrupt has "
                f"{len(corrupt_ids)} tokens, clean {len(clean_ids)}, align={align!r}); paired "
                f"corrupt positions are {list(pairs)}"
            )
    cells = _cells(point, layers, cols, heads)
    addresses = sorted({f"{point}.{layer}" for layer in layers})
    source = await model.capture([clean_ids], addresses)
    steerings: list[Steering | None] = [None, None]
    dst = tuple(pairs)
    src = tuple(pairs[p] for p in dst)
    for layer, c in cells:
        address = f"{point}.{layer}"
        rows = source[address][0]
        if heads:
            width = model.point_width(address)
            op = Patch(rows[list(src)].float(), dst, heads=(c,), head_dim=width // len(cols))
        else:
            op = Patch(rows[[pairs[c]]].float(), (c,))
        steerings.append(Steering(point, (layer,), (op,), PositionMask()))
    prompts = [clean_ids] + [corrupt_ids] * (len(steerings) - 1)
    if all(len(a) == 1 for a in answers) and metric.token_fn is not None:
        selected, lse = await model.final_token_logits(prompts, steerings, [a[0] for a in answers])
        scores = metric.token_fn(selected, lse).float().cpu()
    elif all(len(a) == 1 for a in answers):
        logits = await final_logits(model, prompts, steerings)
        scores = metric.fn(logits, tuple(a[0] for a in answers)).float().cpu()
    else:
        assert metric.seq_fn is not None  # answer_ids refused multi-token answers without it
        scores = metric.seq_fn(await answer_logprobs(model, prompts, steerings, answers))
        scores = scores.float().cpu()
    return SweepResult(
        point=point,
        rows=layers,
        cols=cols,
        col_kind="head" if heads else "position",
        values=scores[2:].reshape(len(layers), len(cols)),
        clean=float(scores[0]),
        corrupt=float(scores[1]),
        sources=() if heads else tuple(pairs[c] for c in cols),
    )


def patch_sweep(model: ModelLike, clean: Prompt, corrupt: Prompt, **kw: Any) -> SweepResult:
    """Synchronous `patch_sweep_async` (see there), for scripts and notebooks."""
    return run(patch_sweep_async(unwrap(model), clean, corrupt, **kw))


__all__ = [
    "Align",
    "Metric",
    "SweepResult",
    "align_positions",
    "answer_logprobs",
    "answer_prob",
    "answer_tokens",
    "decode_rows",
    "final_logits",
    "logit_diff",
    "mean_activation",
    "mean_activation_async",
    "patch_sweep",
    "patch_sweep_async",
    "prompt_token_ids",
    "single_token",
]
