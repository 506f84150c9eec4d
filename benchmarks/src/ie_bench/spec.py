"""What the harness measures: models, backend variants, workloads and size profiles, as plain data.

Importing this module never imports torch, so `ie bench list`, the report and the dashboard can read
the grid on a machine without an engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from ie_core.tooling.load_sampling import SETTLE_S

Direction = Literal["higher", "lower"]

# Stands for the mid-stack layer inside a variant's load kwargs: a static write site has to be named
# before the model exists, and the layer differs per model, so the cell resolves it from the config.
MID = "{mid}"


@dataclass(frozen=True)
class ModelSpec:
    """A checkpoint the sweep knows by a short key (used in file names and table rows)."""

    key: str
    model_id: str
    label: str
    capture_point: str = "resid_post"


@dataclass(frozen=True)
class VariantSpec:
    """One column of the tables: a backend plus the load arguments that define it."""

    key: str
    backend: str
    label: str
    description: str
    load_kwargs: Any = field(default_factory=lambda: MappingProxyType({}))
    vllm_engine: bool = True
    capture_capable: bool = True


@dataclass(frozen=True)
class Metric:
    """One reported figure of a workload; `direction` says which way is better."""

    key: str
    unit: str
    direction: Direction
    description: str


@dataclass(frozen=True)
class WorkloadSpec:
    key: str
    description: str
    isolates: str
    metrics: tuple[Metric, ...]
    headline: str  # the metric key the report's summary tables use


@dataclass(frozen=True)
class Profile:
    """Workload sizes and conditions. Chosen by `--profile` and recorded in every cell."""

    name: str
    description: str
    prompt_tokens: int
    new_tokens: int
    concurrency: int
    capture_gen_tokens: int
    lens_rows: int
    lens_k: int
    repeats: int
    warmup: int
    dtype: str
    device: str
    torch_threads: int | None
    cell_timeout_s: int
    min_free_gib: float
    # How the repeats become a figure: "best" (each metric's best repeat, as the paired static
    # script and the quiet figures do: the least disturbed run) or "median".
    aggregate: str = "best"
    # Idle seconds before each timed step of an interleaved group (ie_core.tooling.load_sampling.SETTLE_S).
    settle_s: float = SETTLE_S

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


MODELS: tuple[ModelSpec, ...] = (
    ModelSpec("smollm2-135m", "HuggingFaceTB/SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct"),
    # Random weights, four layers: for tests and smoke runs, never published.
    ModelSpec("synthetic-llama", "ie-synthetic/llama", "synthetic Llama (random weights)"),
)

VARIANTS: tuple[VariantSpec, ...] = (
    VariantSpec(
        "eager",
        "eager",
        "eager",
        "Hugging Face transformers forward with hooks on the real modules",
        vllm_engine=False,
    ),
    VariantSpec(
        "vllm",
        "vllm",
        "vLLM",
        "hooked vLLM: every point on request, compile and graphs off",
    ),
    VariantSpec(
        "vllm-static",
        "vllm-static",
        "vLLM + static taps",
        "compiled vLLM with static taps: resid_post read at every layer, one write site mid-stack",
        load_kwargs=MappingProxyType(
            {"static_points": "auto", "static_writes": (f"resid_post.{MID}",)}
        ),
    ),
    VariantSpec(
        "vllm-eager",
        "vllm-generate",
        "vLLM eager, no hooks",
        "vanilla vLLM with enforce_eager (compile and graphs off, as hooked vllm runs) and no "
        "hooks: vllm / vllm-eager prices the hooks, vllm-eager / vllm-generate the compilation",
        capture_capable=False,
        load_kwargs=MappingProxyType({"enforce_eager": True}),
    ),
    VariantSpec(
        "vllm-generate",
        "vllm-generate",
        "vLLM generate-only",
        "vanilla vLLM at its own defaults: the no-capture ceiling; capture and steering refused",
        capture_capable=False,
    ),
)

_TOK_S = "tok/s"

WORKLOADS: tuple[WorkloadSpec, ...] = (
    WorkloadSpec(
        "generate",
        "one request: prompt, then new tokens, greedy, streamed",
        "single-stream decode rate and time to first token",
        (
            Metric("decode_tok_s", _TOK_S, "higher", "decode tokens/s, first token excluded"),
            Metric("ttft_s", "s", "lower", "time to first token"),
            Metric("prefill_tok_s", _TOK_S, "higher", "prompt tokens / time to first token"),
            Metric("total_s", "s", "lower", "request latency, first call to last token"),
        ),
        headline="decode_tok_s",
    ),
    WorkloadSpec(
        "generate_x8",
        "the generate request, `concurrency` at once (distinct prompts of the same length)",
        "batching: vLLM batches, eager serves one at a time",
        (
            Metric("aggregate_tok_s", _TOK_S, "higher", "all new tokens / wall time"),
            Metric("wall_s", "s", "lower", "wall time until the last request finished"),
        ),
        headline="aggregate_tok_s",
    ),
    WorkloadSpec(
        "capture_mid",
        "capture the capture point at the middle layer over the prompt",
        "prefill plus one point's transport",
        (
            Metric("latency_s", "s", "lower", "call to returned tensors"),
            Metric("mib", "MiB", "lower", "bytes of tensors returned"),
        ),
        headline="latency_s",
    ),
    WorkloadSpec(
        "capture_all",
        "capture the capture point at every layer over the prompt",
        "transport, since the forward is the same as capture_mid",
        (
            Metric("latency_s", "s", "lower", "call to returned tensors"),
            Metric("mib", "MiB", "lower", "bytes of tensors returned"),
        ),
        headline="latency_s",
    ),
    WorkloadSpec(
        "capture_gen",
        "generate `capture_gen_tokens` tokens capturing the capture point at the middle layer",
        "decode-time capture",
        (
            Metric("latency_s", "s", "lower", "call to returned generation and tensors"),
            Metric("tok_s", _TOK_S, "higher", "new tokens / latency"),
            Metric("mib", "MiB", "lower", "bytes of tensors returned"),
        ),
        headline="latency_s",
    ),
    WorkloadSpec(
        "steer",
        "capture_gen again with an additive steering vector at the middle layer",
        "steering, since nothing else differs from capture_gen",
        (
            Metric("latency_s", "s", "lower", "call to returned generation and tensors"),
            Metric("tok_s", _TOK_S, "higher", "new tokens / latency"),
            Metric("mib", "MiB", "lower", "bytes of tensors returned"),
        ),
        headline="latency_s",
    ),
    WorkloadSpec(
        "lens_topk",
        "`lens_rows` residual rows read out to top-k ids, checked against the full read-out",
        "the lens read-out alone, no forward attached",
        (
            Metric("latency_s", "s", "lower", "call to returned ids and probabilities"),
            Metric("rows_s", "rows/s", "higher", "rows / latency"),
        ),
        headline="latency_s",
    ),
)

CAPTURE_WORKLOADS: frozenset[str] = frozenset(
    {"capture_mid", "capture_all", "capture_gen", "steer", "lens_topk"}
)

PROFILES: tuple[Profile, ...] = (
    Profile(
        name="gpu",
        description="the seed's sizes on a CUDA GPU: 512-token prompt, 128 new tokens, bf16",
        prompt_tokens=512,
        new_tokens=128,
        concurrency=8,
        capture_gen_tokens=32,
        lens_rows=512,
        lens_k=10,
        repeats=5,
        warmup=1,
        dtype="bfloat16",
        device="cuda",
        torch_threads=None,
        cell_timeout_s=1800,
        min_free_gib=4.0,
    ),
    Profile(
        name="cpu",
        description=(
            "shrunk for a 2-core CPU machine so the SmolLM2 sweep of 4 variants fits in 30 minutes: "
            "128-token prompt, 32 new tokens, best of 3 repeats, fp32, one torch thread"
        ),
        prompt_tokens=128,
        new_tokens=32,
        concurrency=8,
        capture_gen_tokens=32,
        lens_rows=128,
        lens_k=10,
        repeats=3,
        warmup=1,
        dtype="float32",
        device="cpu",
        # One compute thread, like vLLM's own CPU binding here (it reserves a core for its
        # front end); two threads on a shared 2-core machine spin against other processes.
        torch_threads=1,
        # Compiled vLLM start-up took 19 minutes on this machine under other users' load.
        cell_timeout_s=1800,
        min_free_gib=3.0,
    ),
    Profile(
        name="tiny",
        description="smoke test sizes for synthetic models: 16-token prompt, 4 new tokens, 1 repeat",
        prompt_tokens=16,
        new_tokens=4,
        concurrency=8,
        capture_gen_tokens=4,
        lens_rows=16,
        lens_k=10,
        repeats=1,
        warmup=1,
        dtype="float32",
        device="cpu",
        torch_threads=1,
        cell_timeout_s=600,
        min_free_gib=1.0,
        settle_s=0.0,  # smoke runs publish no figure
    ),
)


def _by_key(items: tuple[Any, ...], attr: str, kind: str, key: str) -> Any:
    for item in items:
        if getattr(item, attr) == key:
            return item
    known = ", ".join(getattr(i, attr) for i in items)
    raise KeyError(f"unknown {kind} {key!r}; known: {known}")


def get_model(key: str) -> ModelSpec:
    """A spec model by key; an id not in the spec becomes an ad-hoc model keyed by its last part."""
    for model in MODELS:
        if key in (model.key, model.model_id):
            return model
    if "/" in key:
        return ModelSpec(key.rsplit("/", 1)[-1].lower(), key, key)
    return _by_key(MODELS, "key", "model", key)


def get_variant(key: str) -> VariantSpec:
    return _by_key(VARIANTS, "key", "variant", key)


def get_workload(key: str) -> WorkloadSpec:
    return _by_key(WORKLOADS, "key", "workload", key)


def get_profile(name: str) -> Profile:
    return _by_key(PROFILES, "name", "profile", name)


def one_engine_at_a_time(profile: Profile) -> bool:
    """Whether the profile's cells must never hold two engines at once.

    A vLLM engine on CUDA reserves its `gpu_memory_utilization` share of the device (0.9 unless
    told) when it starts, so a second engine beside it fails or measures a starved KV cache.
    """
    return profile.device == "cuda"


def mid_layer(n_layers: int) -> int:
    return n_layers // 2


def resolve_kwargs(kwargs: Any, mid: int) -> dict[str, Any]:
    """The variant's load kwargs with the mid-layer placeholder filled in."""

    def fill(value: Any) -> Any:
        if isinstance(value, str):
            return value.replace(MID, str(mid))
        if isinstance(value, tuple | list):
            return [fill(v) for v in value]
        return value

    return {k: fill(v) for k, v in dict(kwargs).items()}


def direction(workload: str, key: str) -> Direction | None:
    """Which way a workload's metric is better, or None for a metric the spec does not list."""
    for w in WORKLOADS:
        if w.key == workload:
            for m in w.metrics:
                if m.key == key:
                    return m.direction
    return None


def aggregate(profile: Profile, workload: str, key: str, values: list[float]) -> float:
    """The figure of a metric's repeats under the profile's rule (see `Profile.aggregate`)."""
    import statistics

    if profile.aggregate == "median":
        return statistics.median(values)
    way = direction(workload, key)
    if way == "higher":
        return max(values)
    if way == "lower":
        return min(values)
    return statistics.median(values)
