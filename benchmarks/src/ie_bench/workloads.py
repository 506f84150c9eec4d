"""The timed operations, written once against the `InterpModel` protocol so every backend runs them.

Each workload is a coroutine `once(ctx) -> Sample` plus an optional `check(ctx, last) -> detail`
that runs after the timed repeats. `measure` runs one unmeasured warm-up, then the repeats, and
reports each metric's figure by the profile's rule (`spec.aggregate`: best repeat, or median).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ie_core.cache import ActivationCache
from ie_core.errors import PointUnavailableError, UnsupportedOperationError
from ie_core.ops import Additive, steer_at
from ie_core.protocol import InterpModel, SamplingParams

from ie_bench.spec import Profile, aggregate

MIB = 1024**2
STEER_COEFF = 8.0
REFUSALS = (UnsupportedOperationError, PointUnavailableError)


class Unsupported(Exception):
    """The backend answered, but not with what the workload asked for; the message says what came back."""


@dataclass
class Context:
    model: InterpModel
    profile: Profile
    prompts: list[list[int]]
    capture_point: str
    mid: int
    n_layers: int
    d_model: int
    memo: dict[str, Any] = field(default_factory=dict)

    @property
    def prompt(self) -> list[int]:
        return self.prompts[0]

    @property
    def mid_address(self) -> str:
        return f"{self.capture_point}.{self.mid}"


@dataclass(frozen=True)
class Sample:
    metrics: dict[str, float]
    detail: dict[str, Any]
    result: Any = None


@dataclass(frozen=True)
class Outcome:
    status: str  # ok | unsupported | error
    metrics: dict[str, float]
    samples: dict[str, list[float]]
    detail: dict[str, Any]


def _mib(cache: ActivationCache) -> float:
    return sum(t.numel() * t.element_size() for t in cache.values()) / MIB


def _shapes(cache: ActivationCache) -> dict[str, list[int]]:
    return {str(a): list(t.shape) for a, t in cache.items()}


def _rows(tensor: Any) -> int:
    """Positions a captured tensor covers: `[batch, seq, ...]` or `[seq, ...]`."""
    return int(tensor.shape[1] if tensor.dim() >= 3 else tensor.shape[0])


def _require_rows(cache: ActivationCache, addresses: Sequence[str], rows: int) -> None:
    """Refuse a capture that came back short, empty or all zeros: that is not a measurement."""
    missing = [a for a in addresses if a not in cache]
    if missing:
        raise Unsupported(
            f"asked for {len(addresses)} points, got {_shapes(cache)}; missing {missing[:3]}"
        )
    for address in addresses:
        tensor = cache[address]
        if _rows(tensor) < rows:
            raise Unsupported(
                f"{address} came back {list(tensor.shape)}, expected {rows} positions"
            )
        if not bool(tensor.abs().sum() > 0):
            raise Unsupported(f"{address} came back all zeros, shape {list(tensor.shape)}")


def _greedy(new_tokens: int) -> SamplingParams:
    # stop_at_eos off: every request generates exactly `new_tokens`, so rates compare.
    return SamplingParams(max_new_tokens=new_tokens, stop_at_eos=False)


# --- generate ------------------------------------------------------------------------------------


async def generate_once(ctx: Context) -> Sample:
    sampling = _greedy(ctx.profile.new_tokens)
    start = time.perf_counter()
    stamps: list[float] = []
    async for _chunk in ctx.model.generate_stream(ctx.prompt, sampling):
        stamps.append(time.perf_counter())
    if not stamps:
        raise Unsupported("generate_stream yielded no tokens")
    ttft = stamps[0] - start
    metrics = {
        "ttft_s": ttft,
        "prefill_tok_s": len(ctx.prompt) / ttft,
        "total_s": stamps[-1] - start,
    }
    if len(stamps) > 1:
        # The first token's cost is the prefill, reported as TTFT; the decode rate starts after it.
        metrics["decode_tok_s"] = (len(stamps) - 1) / (stamps[-1] - stamps[0])
    return Sample(metrics, {"new_tokens": len(stamps), "prompt_tokens": len(ctx.prompt)})


async def generate_x8_once(ctx: Context) -> Sample:
    sampling = _greedy(ctx.profile.new_tokens)
    prompts = ctx.prompts[: ctx.profile.concurrency]
    start = time.perf_counter()
    results = await asyncio.gather(*(ctx.model.generate(p, sampling) for p in prompts))
    wall = time.perf_counter() - start
    tokens = sum(len(r.token_ids) for r in results)
    return Sample(
        {"aggregate_tok_s": tokens / wall, "wall_s": wall},
        {"requests": len(prompts), "new_tokens": tokens},
    )


# --- capture -------------------------------------------------------------------------------------


async def _capture(ctx: Context, addresses: list[str]) -> Sample:
    start = time.perf_counter()
    cache = await ctx.model.capture(ctx.prompt, addresses)
    latency = time.perf_counter() - start
    _require_rows(cache, addresses, len(ctx.prompt))
    first = cache[addresses[0]]
    ctx.memo.setdefault("capture_dtype", str(first.dtype).removeprefix("torch."))
    detail = {
        "points": len(addresses),
        "shape": list(first.shape),
        "dtype": ctx.memo["capture_dtype"],
    }
    return Sample({"latency_s": latency, "mib": _mib(cache)}, detail)


async def capture_mid_once(ctx: Context) -> Sample:
    return await _capture(ctx, [ctx.mid_address])


async def capture_all_once(ctx: Context) -> Sample:
    return await _capture(ctx, [f"{ctx.capture_point}.{i}" for i in range(ctx.n_layers)])


def steering_vector(d_model: int, seed: int = 0) -> tuple[float, ...]:
    """A fixed unit direction, the same for every backend of a model."""
    rng = random.Random(seed)
    raw = [rng.gauss(0.0, 1.0) for _ in range(d_model)]
    norm = sum(x * x for x in raw) ** 0.5
    return tuple(x / norm for x in raw)


async def _capture_gen(ctx: Context, steered: bool) -> Sample:
    steering = None
    if steered:
        vector = steering_vector(ctx.d_model)
        steering = steer_at(ctx.mid_address, Additive(vector, STEER_COEFF))
    tokens = ctx.profile.capture_gen_tokens
    start = time.perf_counter()
    out = await ctx.model.capture_generation(
        ctx.prompt, [ctx.mid_address], _greedy(tokens), steering=steering
    )
    latency = time.perf_counter() - start
    got = len(out.generation.token_ids)
    _require_rows(out.cache, [ctx.mid_address], len(ctx.prompt) + got - 1)
    return Sample(
        {"latency_s": latency, "tok_s": got / latency, "mib": _mib(out.cache)},
        {"new_tokens": got, "shape": list(out.cache[ctx.mid_address].shape)},
        out,
    )


async def capture_gen_once(ctx: Context) -> Sample:
    return await _capture_gen(ctx, steered=False)


async def steer_once(ctx: Context) -> Sample:
    return await _capture_gen(ctx, steered=True)


async def steer_check(ctx: Context, last: Sample) -> dict[str, Any]:
    """Negative control: a steered run that equals the unsteered one means steering was ignored."""
    plain = await _capture_gen(ctx, steered=False)
    steered_rows = last.result.cache[ctx.mid_address].float().reshape(-1, ctx.d_model)
    plain_rows = plain.result.cache[ctx.mid_address].float().reshape(-1, ctx.d_model)
    n = min(steered_rows.shape[0], plain_rows.shape[0])
    diff = (steered_rows[:n] - plain_rows[:n]).norm(dim=-1)
    effect = float(diff.max())
    if effect == 0.0:
        raise RuntimeError("steering had no effect: steered and plain captures are identical")
    # A capture at the steered site sees h + coeff * v, so prompt rows differ by about the coefficient.
    return {
        "effect_max_norm": effect,
        "effect_median_norm": float(diff.median()),
        "coeff": STEER_COEFF,
    }


# --- lens ----------------------------------------------------------------------------------------


def lens_rows(ctx: Context) -> Any:
    """Fixed pseudo-residual rows: backend independent, so every column decodes the same input."""
    import torch

    if "lens_rows" not in ctx.memo:
        gen = torch.Generator().manual_seed(0)
        ctx.memo["lens_rows"] = torch.randn(ctx.profile.lens_rows, ctx.d_model, generator=gen) * 4.0
    return ctx.memo["lens_rows"]


async def lens_topk_once(ctx: Context) -> Sample:
    rows = lens_rows(ctx)
    start = time.perf_counter()
    top = await ctx.model.decode_residuals_topk(rows, ctx.profile.lens_k)
    latency = time.perf_counter() - start
    shape = list(top.ids.shape)
    if shape != [rows.shape[0], ctx.profile.lens_k]:
        raise Unsupported(
            f"top-k ids came back {shape}, expected {[rows.shape[0], ctx.profile.lens_k]}"
        )
    return Sample({"latency_s": latency, "rows_s": rows.shape[0] / latency}, {"shape": shape}, top)


async def lens_topk_check(ctx: Context, last: Sample) -> dict[str, Any]:
    """The top-k ids must be the top-k of the full read-out (ties allowed to reorder)."""
    import torch

    full = (await ctx.model.decode_residuals(lens_rows(ctx))).float()
    k = ctx.profile.lens_k
    ref = torch.topk(full, k, dim=-1)
    ids = torch.as_tensor(last.result.ids).long()
    got_logits = torch.gather(full, 1, ids)
    # Same logits at each rank means the same answer up to ties between equal logits.
    tol = 1e-4 * float(full.abs().max())
    bad = int(((got_logits - ref.values).abs() > tol).any(dim=-1).sum())
    ref_probs = torch.softmax(full, dim=-1).gather(1, ids)
    prob_diff = float((torch.as_tensor(last.result.probs).float() - ref_probs).abs().max())
    if bad:
        raise RuntimeError(
            f"top-{k} ids disagree with the full read-out on {bad} of {ids.shape[0]} rows"
        )
    if prob_diff > 1e-3:
        raise RuntimeError(
            f"top-{k} probabilities differ from the full read-out by {prob_diff:.2e}"
        )
    return {
        "checked_rows": int(ids.shape[0]),
        "max_prob_diff": prob_diff,
        "exact_ids": bool((ids == ref.indices).all()),
    }


# --- the table -----------------------------------------------------------------------------------

Once = Callable[[Context], Awaitable[Sample]]
Check = Callable[[Context, Sample], Awaitable[dict[str, Any]]]

RUNNERS: dict[str, tuple[Once, Check | None]] = {
    "generate": (generate_once, None),
    "generate_x8": (generate_x8_once, None),
    "capture_mid": (capture_mid_once, None),
    "capture_all": (capture_all_once, None),
    "capture_gen": (capture_gen_once, None),
    "steer": (steer_once, steer_check),
    "lens_topk": (lens_topk_once, lens_topk_check),
}


def _error_detail(exc: BaseException) -> dict[str, Any]:
    return {"error_type": type(exc).__name__, "message": str(exc)}


def _failure(exc: Exception) -> Outcome:
    """Refusals and short answers are `unsupported`; anything else is an `error`."""
    if isinstance(exc, REFUSALS):
        return Outcome("unsupported", {}, {}, {**_error_detail(exc), "what_came_back": "refused"})
    if isinstance(exc, Unsupported):
        return Outcome("unsupported", {}, {}, {**_error_detail(exc), "what_came_back": str(exc)})
    return Outcome("error", {}, {}, _error_detail(exc))


@dataclass
class Tally:
    """One workload's samples on one model so far; its first refusal or failure ends it.

    `measure` drives one tally to the end; the interleaved sweep (`ie_bench.group`) steps the
    tallies of several models in turn, so every repeat of a ratio ran under the same condition.
    """

    workload: str
    samples: list[Sample] = field(default_factory=list)
    failed: Outcome | None = None
    seconds: float = 0.0

    async def step(self, ctx: Context, warmup: bool = False) -> None:
        if self.failed is not None:
            return
        once, _ = RUNNERS[self.workload]
        started = time.perf_counter()
        try:
            sample = await once(ctx)
        except Exception as exc:
            self.failed = _failure(exc)
            return
        finally:
            self.seconds += time.perf_counter() - started
        if not warmup:
            self.samples.append(sample)

    async def outcome(self, ctx: Context) -> Outcome:
        """The samples' figures (`spec.aggregate`), after the workload's check on the last one."""
        if self.failed is not None:
            return self.failed
        if not self.samples:
            return Outcome("error", {}, {}, {"message": "no timed repeat ran"})
        _, check = RUNNERS[self.workload]
        detail: dict[str, Any] = dict(self.samples[-1].detail)
        started = time.perf_counter()
        if check is not None:
            try:
                detail["check"] = await check(ctx, self.samples[-1])
            except Exception as exc:
                return _failure(exc)
        keys = sorted({k for s in self.samples for k in s.metrics})
        series = {k: [s.metrics[k] for s in self.samples if k in s.metrics] for k in keys}
        metrics = {k: aggregate(ctx.profile, self.workload, k, v) for k, v in series.items()}
        detail["seconds"] = self.seconds + time.perf_counter() - started
        return Outcome("ok", metrics, series, detail)


async def measure(ctx: Context, workload: str) -> Outcome:
    """Warm up, repeat, aggregate. Refusals and short answers are `unsupported`, not errors."""
    tally = Tally(workload)
    for _ in range(ctx.profile.warmup):
        await tally.step(ctx, warmup=True)
    for _ in range(ctx.profile.repeats):
        await tally.step(ctx)
    return await tally.outcome(ctx)
