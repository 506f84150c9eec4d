"""What the GPU check runs, as plain data: engines, columns, the interleaved schedule, the record.

Nothing here imports torch or vLLM, so `--dry-run` prints the plan on any machine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
DEFAULT_STREAMS = (1, 8, 64)
PARITY_MODES = ("FULL_AND_PIECEWISE", "PIECEWISE")
PARITY_TOL = 1e-4  # |diff| / |row|, fp32: compiled and eager kernels differ only in rounding

# Streamed workloads run at every stream count; the others are one call each.
STREAMED = ("generate", "capture_all", "steer")
SINGLE = ("patch_sweep", "sae")
WORKLOAD_TEXT = {
    "generate": "plain greedy generation",
    "capture_all": "generation capturing resid_post at every layer (prompt + generated rows)",
    "steer": "generation with an additive steering vector at resid_post.<mid>",
    "patch_sweep": "ie_core.experiments.patching.patch_sweep, resid_post.<mid> x every position, all cells "
    "in flight (logit_diff ' Paris' vs ' Rome')",
    "sae": "ie_core.experiments.features.feature_activations, top-32 of a dictionary at resid_post.<mid> "
    "over 8 rows of 128 tokens (random weights, 8 x d_model features, unless --sae)",
}
METRICS = {
    "generate": "tok/s",
    "capture_all": "tok/s",
    "steer": "tok/s",
    "patch_sweep": "cells/s",
    "sae": "rows/s",
}

# What every result records besides its figures (`facts.py` and `measure.py` fill these in).
RECORDED = (
    "device: name, compute capability, memory, count; NVIDIA driver; CUDA (torch's runtime and "
    "the driver's)",
    "where vLLM ran: vllm.platforms.current_platform and each vLLM engine's model runner "
    "(ModelInfo.model_runner; empty = unknown) per start",
    "versions: python, torch, vllm, transformers, ie-* packages; git commit of this checkout",
    "model: the id asked for, the local folder, the Hub revision (commit), dtype, layers, width",
    "per column: every round's sample, median, min, max, q1, q3; per engine start: seconds",
    "parity (fp32): per request tokens_equal and max_rel_diff, per CUDA-graph mode",
    "async scheduling (fp32, hooked vllm): parity on against off, keys left registered, and the "
    "capture batch's price on / off (decides whether the engines' refusal can be lifted)",
)


@dataclass(frozen=True)
class EngineSpec:
    """One engine the check starts: a backend, the workloads it prices, its stream limit."""

    key: str
    backend: str
    label: str
    workloads: tuple[str, ...]
    max_streams: int | None = None  # None: every stream count
    why_limited: str = ""


ENGINES: tuple[EngineSpec, ...] = (
    EngineSpec(
        "eager",
        "eager",
        "HF transformers with hooks (ie-eager)",
        (*STREAMED, *SINGLE),
        max_streams=8,
        why_limited="ie-eager serves one request at a time, so 64 streams cost 8x the 8-stream "
        "wall and tell nothing new",
    ),
    EngineSpec("hooked", "vllm", "hooked vLLM (compile and graphs off)", (*STREAMED, *SINGLE)),
    EngineSpec(
        "static",
        "vllm-static",
        "compiled vLLM with static taps (reads at every layer, one write at resid_post.<mid>)",
        (*STREAMED, *SINGLE),
    ),
    EngineSpec(
        "vanilla",
        "vllm-generate",
        "vanilla vLLM at its defaults (generation only: capture and steering refused)",
        ("generate",),
    ),
)


@dataclass(frozen=True)
class Column:
    """One priced figure: an engine, a workload and, for a streamed one, the requests in flight."""

    engine: str
    workload: str
    streams: int | None = None

    @property
    def key(self) -> str:
        tail = f"/c{self.streams}" if self.streams is not None else ""
        return f"{self.engine}/{self.workload}{tail}"


@dataclass(frozen=True)
class Step:
    """One action of the schedule: start or stop an engine, warm it up, or measure a column."""

    round: int
    kind: Literal["start", "warmup", "measure", "stop"]
    engine: str
    column: Column | None = None


@dataclass(frozen=True)
class Plan:
    model: str
    revision: str | None
    dtype: str
    rounds: int
    streams: tuple[int, ...]
    new_tokens: int
    parity: bool
    engines: tuple[EngineSpec, ...] = ENGINES

    def columns(self, engine: EngineSpec) -> list[Column]:
        cols = []
        for workload in engine.workloads:
            if workload in SINGLE:
                cols.append(Column(engine.key, workload))
                continue
            limit = engine.max_streams
            cols += [
                Column(engine.key, workload, n) for n in self.streams if limit is None or n <= limit
            ]
        return cols

    def all_columns(self) -> list[Column]:
        return [c for e in self.engines for c in self.columns(e)]

    def skipped(self) -> list[str]:
        """Columns the plan leaves out, each with its reason."""
        out = []
        for e in self.engines:
            if e.max_streams is not None:
                over = [n for n in self.streams if n > e.max_streams]
                if over:
                    out.append(f"{e.key} at {', '.join(map(str, over))} streams: {e.why_limited}")
        return out


def rotate(items: Sequence[str] | Sequence[Column], r: int) -> list:
    """`items` started at position r (mod len): round r's order, so no column is always first."""
    if not items:
        return []
    k = r % len(items)
    return [*items[k:], *items[:k]]


def schedule(plan: Plan) -> list[Step]:
    """Round r starts each engine in turn (rotated by r), warms it up, runs every one of its
    columns once (rotated by r) and stops it before the next engine starts."""
    steps: list[Step] = []
    by_key = {e.key: e for e in plan.engines}
    for r in range(plan.rounds):
        for key in rotate([e.key for e in plan.engines], r):
            steps += [Step(r, "start", key), Step(r, "warmup", key)]
            steps += [Step(r, "measure", key, c) for c in rotate(plan.columns(by_key[key]), r)]
            steps.append(Step(r, "stop", key))
    return steps


def max_engines_held(steps: Sequence[Step]) -> int:
    """The most engines the schedule holds at once (1 when every start follows a stop)."""
    held, most = 0, 0
    for step in steps:
        held += {"start": 1, "stop": -1}.get(step.kind, 0)
        most = max(most, held)
    return most


def describe(plan: Plan, out_path: str | None) -> str:
    """The plan as text: what `--dry-run` prints."""
    lines = [
        f"model: {plan.model} (revision {plan.revision or 'main'}), Hub weights or a local HF "
        "folder; never ie-eager's offline GGUF conversion",
        f"dtype: {plan.dtype} for the price, float32 for parity; {plan.new_tokens} new tokens "
        "per request, greedy, EOS ignored, prefix caching off",
        "engines, one at a time (shutdown, then torch.cuda.empty_cache, before the next):",
    ]
    lines += [f"  {e.key:8} backend={e.backend:14} {e.label}" for e in plan.engines]
    if plan.parity:
        lines.append(
            "parity (once, first): hooked vllm fp32 is the reference; vllm-static under "
            f"{' and '.join(PARITY_MODES)}: captures and steered captures within {PARITY_TOL}"
        )
        lines.append(
            "async scheduling (after parity): hooked vllm fp32 with async scheduling off, then "
            "on; captures and steered captures compared, and the capture batch priced"
        )
    lines.append("workloads:")
    lines += [f"  {w:12} {METRICS[w]:8} {text}" for w, text in WORKLOAD_TEXT.items()]
    lines.append(f"columns ({len(plan.all_columns())}), each measured once per round:")
    for e in plan.engines:
        lines.append(f"  {e.key:8} " + ", ".join(c.key.split("/", 1)[1] for c in plan.columns(e)))
    lines += [f"  skipped: {s}" for s in plan.skipped()]
    lines.append(f"rounds: {plan.rounds}, interleaved; engine and column order rotate each round:")
    steps = schedule(plan)
    for r in range(plan.rounds):
        order = [s.engine for s in steps if s.round == r and s.kind == "start"]
        lines.append(f"  round {r}: {' -> '.join(order)}")
    lines.append(f"engines held at once: {max_engines_held(steps)}")
    lines.append("recorded:")
    lines += [f"  {fact}" for fact in RECORDED]
    lines.append(f"writes: {out_path or '(stdout only; pass --out)'}")
    return "\n".join(lines)
