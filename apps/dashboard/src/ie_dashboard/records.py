"""Workload records: the committed benchmark JSON that is not a cell (patch sweep, harvest,
dictionary read-out, steering, circuit tracing, ...), read into sections the throughput page draws.

`RECORDS` is the one table of which files are read and how; each reader takes the workload's
name, sizes and unit from its record (`cells: 420`, `tokens: 8192`) and names its peers as the
record does. A reader checks every figure it takes (present, finite, >= 0) and raises
`RecordError` naming the file's field, so a malformed record is refused whole.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["RECORDS", "Bar", "RecordError", "RecordSpec", "Section", "read_record"]


class RecordError(ValueError):
    """A record a reader cannot draw; the message names the field (`rows[2].wall_s: missing`)."""


@dataclass(frozen=True)
class Bar:
    peer: str
    series: str
    value: float | None  # None: the peer did not produce this figure (`status` says why)
    status: str = ""
    note: str = ""  # per-figure provenance, e.g. the load the record logged around it


@dataclass(frozen=True)
class Section:
    """One workload with its peers: what the page draws as one card."""

    key: str  # short id, unique on the page (the anchor)
    title: str
    unit: str
    lower_better: bool
    about: str
    series: tuple[str, ...]
    bars: tuple[Bar, ...]
    command: str = ""
    machine: str = ""
    when: str = ""
    load: str = ""  # the record's own load / "measured alone" note
    alone: bool | None = None  # True: the record says measured alone; None: it says nothing
    source: str = ""  # the record file, filled in at ingest
    peers: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.peers:  # peers in the record's order, each once
            object.__setattr__(self, "peers", tuple(dict.fromkeys(b.peer for b in self.bars)))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Section:
        bars = tuple(Bar(**b) for b in data["bars"])
        rest = {k: v for k, v in data.items() if k not in ("bars", "series", "peers")}
        return cls(**rest, series=tuple(data["series"]), bars=bars, peers=tuple(data["peers"]))

    def value(self, peer: str, series: str) -> Bar | None:
        return next((b for b in self.bars if b.peer == peer and b.series == series), None)


# ------------------------------------------------------------------ checked access


def _get(obj: Any, path: str) -> Any:
    """`rows[2].wall_s`-style walk; a missing key or a wrong container names the path. Keys
    holding '.' or '[' cannot be named this way; no committed record has one."""
    cur, where = obj, ""
    for part in path.replace("[", ".[").split("."):
        if not part:
            continue
        where = f"{where}{part}" if part.startswith("[") or not where else f"{where}.{part}"
        if part.startswith("["):
            index = int(part[1:-1])
            if not isinstance(cur, list) or index >= len(cur):
                raise RecordError(f"{where}: missing")
            cur = cur[index]
        else:
            if not isinstance(cur, dict) or part not in cur:
                raise RecordError(f"{where}: missing")
            cur = cur[part]
    return cur


def _num(obj: Any, path: str) -> float:
    value = _get(obj, path)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RecordError(f"{path}: expected a number, got {type(value).__name__}")
    if not math.isfinite(value) or value < 0:
        raise RecordError(f"{path}: {value} is not a finite number >= 0")
    return float(value)


def _dict(obj: Any, path: str) -> dict[str, Any]:
    value = _get(obj, path)
    if not isinstance(value, dict) or not value:
        raise RecordError(f"{path}: expected a non-empty object")
    return value


def _list(obj: Any, path: str) -> list[Any]:
    value = _get(obj, path)
    if not isinstance(value, list) or not value:
        raise RecordError(f"{path}: expected a non-empty list")
    return value


def _text(obj: Any, path: str, default: str = "") -> str:
    try:
        return str(_get(obj, path))
    except RecordError:
        return default


def _loads(values: Any) -> str:
    """[1.16, 3.15, 6.25] -> '1.16 / 3.15 / 6.25' (the 1-, 5- and 15-minute load averages)."""
    if isinstance(values, list) and all(isinstance(v, int | float) for v in values):
        return " / ".join(f"{v:.2f}" for v in values)
    return "?"


def _grid(rec: Any, path: str, series_label: Callable[[str], str] = str) -> list[Bar]:
    """`{peer: {series: number}}` -> bars, in the record's order."""
    return [
        Bar(peer, series_label(series), _num(rec, f"{path}.{peer}.{series}"))
        for peer, values in _dict(rec, path).items()
        for series in _dict(rec, f"{path}.{peer}")
        if not isinstance(values.get(series), dict)
    ]


# ------------------------------------------------------------------ readers, one per record


def _patch_sweep(rec: Any) -> list[Section]:
    rows = _list(rec, "rows")
    cells = {int(_num(rec, f"rows[{i}].cells")) for i in range(len(rows))}
    if len(cells) != 1:
        raise RecordError(f"rows[].cells: the engines swept different grids {sorted(cells)}")
    bars = []
    for i, row in enumerate(rows):
        load = f"load {row.get('load_avg_1m_before', '?')} -> {row.get('load_avg_1m_after', '?')}"
        bars.append(
            Bar(
                _text(rec, f"rows[{i}].engine"),
                "grid wall time",
                _num(rec, f"rows[{i}].wall_s"),
                note=f"setup {_num(rec, f'rows[{i}].setup_s'):.1f} s; 1-min {load}",
            )
        )
    return [
        Section(
            "patch-sweep",
            f"Patch sweep: {cells.pop()}-cell grid",
            "s",
            True,
            f"activation patching of {_text(rec, 'model')}: every (layer, position) cell, "
            f"clean {_text(rec, 'clean')!r} vs corrupt {_text(rec, 'corrupt')!r}",
            ("grid wall time",),
            tuple(bars),
            load="1-minute load average logged before and after each engine (per bar)",
        )
    ]


def _harvest(rec: Any) -> list[Section]:
    alone = rec.get("measured_alone")
    runs = alone.get("runs", []) if isinstance(alone, dict) else []
    load = "; ".join(
        f"{r.get('variants')}: load {_loads(r.get('load_average_start'))} -> "
        f"{_loads(r.get('load_average_end'))}" + (f" ({r['why']})" if r.get("why") else "")
        for r in runs
        if isinstance(r, dict)
    )
    bars = _grid(rec, "tokens_per_s")
    return [
        Section(
            "harvest",
            f"Harvest: {int(_num(rec, 'tokens'))} tokens, context {int(_num(rec, 'context'))}",
            "tok/s",
            False,
            f"residual activations of {_text(rec, 'model')} over a corpus, one layer and every "
            "layer, written out for dictionary training",
            tuple(dict.fromkeys(b.series for b in bars)),
            tuple(bars),
            command=_text(rec, "measured_alone.command"),
            machine=_text(rec, "machine"),
            when=_text(rec, "when"),
            load=load,
            alone=True if runs else None,
        )
    ]


def _sae_features(rec: Any) -> list[Section]:
    args = _dict(rec, "args")
    bars = [
        Bar(peer, series, _num(rec, f"results.{peer}.{series}.tok_per_s"))
        for peer, by_series in _dict(rec, "results").items()
        for series in by_series
    ]
    alone = rec.get("measured_alone")
    load = ""
    if isinstance(alone, dict):
        load = (
            f"load {_loads(alone.get('load_average_start'))} -> "
            f"{_loads(alone.get('load_average_end'))}; {alone.get('note', '')}"
        )
    return [
        Section(
            "dictionary-readout",
            f"Dictionary read-out: SAE width {args.get('width')}, top-{args.get('k')}",
            "tok/s",
            False,
            f"generation with SAE feature read-out on no, 1 or 4 layers, {args.get('concurrency')} "
            f"requests of {args.get('new_tokens')} new tokens",
            tuple(dict.fromkeys(b.series for b in bars)),
            tuple(bars),
            command=" ".join(f"--{k} {v}" for k, v in args.items() if k != "saelens_python"),
            machine=f"{_text(rec, 'machine')}, {_text(rec, 'threads', '?')} threads",
            when=_text(rec, "when"),
            load=load,
            alone=True if isinstance(alone, dict) else None,
        )
    ]


def _steering(rec: Any) -> list[Section]:
    args = _dict(rec, "args")
    bars = []
    for peer, by in _dict(rec, "results").items():
        load = f"load {_loads(by.get('load_before'))} -> {_loads(by.get('load_after'))}"
        for series, value in by.items():
            if isinstance(value, dict):
                bars.append(
                    Bar(peer, series, _num(rec, f"results.{peer}.{series}.tok_per_s"), note=load)
                )
    return [
        Section(
            "steering",
            f"Steering: {args.get('requests')} requests, K distinct vectors per batch",
            "tok/s",
            False,
            f"{args.get('requests')} requests of {args.get('new_tokens')} new tokens, each with "
            f"one of K steering configs (layers {args.get('layers')})",
            tuple(dict.fromkeys(b.series for b in bars)),
            tuple(bars),
            command=" ".join(f"--{k} {v}" for k, v in args.items()),
            machine=f"{_text(rec, 'machine')}, {_text(rec, 'cpus', '?')} cpus",
            when=_text(rec, "when"),
            load="load averages logged before and after each backend (per bar)",
        )
    ]


def _circuit_tracing(rec: Any) -> list[Section]:
    """The record's last round: one graph (the first prompt, the work every peer did alike) in
    seconds, and a batch of prompts in graphs per minute (circuit-tracer one by one)."""
    last = len(_list(rec, "rounds")) - 1
    peers = (("ie_eager", "ie eager"), ("ie_vllm", "ie vllm"), ("circuit_tracer", "circuit-tracer"))
    single, batch = [], []
    for key, name in peers:
        at = f"rounds[{last}].{key}"
        rss = f"peak RSS {_num(rec, f'{at}.peak_rss_mib_single'):.0f} MiB"
        single.append(Bar(name, "one graph", _num(rec, f"{at}.single_seconds"), note=rss))
        batch.append(Bar(name, "batch", _num(rec, f"{at}.graphs_per_minute")))
    load = _text(rec, "load_note")
    n = len(_list(rec, "prompts"))
    common = {
        "command": _text(rec, "command"),
        "machine": f"{_text(rec, 'machine.cpus', '?')} cpus, {_text(rec, 'machine.platform')}",
        "load": load,
        "alone": True if load.startswith("measured alone") else None,
    }
    about = (
        f"{_text(rec, 'model')}, transcoders {_text(rec, 'transcoders')}; {_text(rec, 'same_work')}"
    )
    return [
        Section(
            "circuit-tracing",
            "Circuit tracing: one attribution graph",
            "s",
            True,
            about,
            ("one graph",),
            tuple(single),
            **common,
        ),
        Section(
            "circuit-tracing-batch",
            f"Circuit tracing: graphs per minute over {n} prompts",
            "graphs/min",
            False,
            about + "; ie batches the forwards (attribute_many), circuit-tracer runs one by one",
            ("batch",),
            tuple(batch),
            **common,
        ),
    ]


def _static_generate(rec: Any) -> list[Section]:
    """Peers are the record's backend objects; the tok/s workloads are those keyed by request
    count (`c1`, `c8`) like `generate` (engine_cpu_ms_per_token is another unit)."""
    peers = [k for k, v in rec.items() if isinstance(v, dict) and "generate" in v]
    if not peers:
        raise RecordError("no backend object with a 'generate' entry")
    levels = list(_dict(rec, f"{peers[0]}.generate"))
    workloads = [
        k
        for k in dict.fromkeys(w for p in peers for w in rec[p])
        if k.endswith(("generate", "resid_post"))
    ]
    bars = []
    for peer in peers:
        for key in workloads:
            for level in levels:
                if key in rec[peer]:
                    bars.append(Bar(peer, f"{key} {level}", _num(rec, f"{peer}.{key}.{level}")))
                else:
                    bars.append(Bar(peer, f"{key} {level}", None, status="not measured"))
    return [
        Section(
            "static-vs-generate",
            f"Compiled taps vs vLLM generate-only: {int(_num(rec, 'new_tokens'))} new tokens",
            "tok/s",
            False,
            f"{_text(rec, 'model')}: decode with 1 and 8 requests, and capturing resid_post at "
            "every layer while generating (vllm-generate cannot capture)",
            tuple(dict.fromkeys(b.series for b in bars)),
            tuple(bars),
        )
    ]


def _quantized(rec: Any) -> list[Section]:
    bars = []
    for i, cell in enumerate(_list(rec, "cells")):
        peer = f"{_text(rec, f'cells[{i}].backend')} {_text(rec, f'cells[{i}].model')}"
        bars.append(Bar(peer, "decode", _num(rec, f"cells[{i}].decode_tok_s")))
        if cell.get("capture_tok_s") is None:
            bars.append(Bar(peer, "decode + capture", None, status="refused"))
        else:
            bars.append(Bar(peer, "decode + capture", _num(rec, f"cells[{i}].capture_tok_s")))
    return [
        Section(
            "quantized",
            "Quantized checkpoints: decode with and without capture",
            "tok/s",
            False,
            f"{', '.join(dict.fromkeys(str(c.get('model')) for c in rec['cells']))} in "
            f"{_text(rec, 'cells[0].dtype')}, {_text(rec, 'cells[0].prompts')} prompts of "
            f"{_text(rec, 'cells[0].tokens')} new tokens",
            ("decode", "decode + capture"),
            tuple(bars),
            machine=f"{_text(rec, 'cpus', '?')} cpus",
            load=f"load {_loads(rec.get('load_average_start'))} -> "
            f"{_loads(rec.get('load_average_end'))}",
        )
    ]


def _capture_overhead(rec: Any) -> list[Section]:
    bars = [
        Bar(peer, f"{length} tokens", _num(rec, f"lengths.{length}.{peer}.median_ms"))
        for length, peers in _dict(rec, "lengths").items()
        for peer in peers
    ]
    quiet = rec.get("quiet") is True
    return [
        Section(
            "capture-overhead",
            "Capture overhead: one forward, captured by each engine",
            "ms",
            True,
            f"{_text(rec, 'model')}: median of {_text(rec, 'repeats')} forwards, "
            f"{_text(rec, 'threads')} thread, per prompt length",
            tuple(dict.fromkeys(b.series for b in bars)),
            tuple(bars),
            command=_text(rec, "command"),
            machine=_text(rec, "machine"),
            when=_text(rec, "when"),
            load="quiet: no other process ran while measuring (the record's load sampler)"
            if quiet
            else "",
            alone=True if quiet else None,
        )
    ]


@dataclass(frozen=True)
class RecordSpec:
    path: str  # relative to the repository root
    read: Callable[[Any], list[Section]]


RECORDS: tuple[RecordSpec, ...] = (
    RecordSpec("benchmarks/results/patching_sweep.json", _patch_sweep),
    RecordSpec("packages/ie-vllm/benchmarks/results/sae_features.json", _sae_features),
    RecordSpec("benchmarks/harvest-results/harvest_throughput.json", _harvest),
    RecordSpec("packages/ie-vllm/benchmarks/results/steering_configs.json", _steering),
    RecordSpec("docs/notes/circuit_tracing_bench.json", _circuit_tracing),
    RecordSpec("docs/notes/static_bench_cpu.json", _static_generate),
    RecordSpec("benchmarks/results/quantized_throughput.json", _quantized),
    RecordSpec(
        "packages/ie-eager/benchmarks/results/capture_overhead-wall-1t.json", _capture_overhead
    ),
)


def read_record(spec: RecordSpec, data: Any) -> list[Section]:
    """The sections of one parsed record, each tagged with its file; RecordError if malformed."""
    if not isinstance(data, dict):
        raise RecordError(f"expected a JSON object, got {type(data).__name__}")
    try:
        sections = spec.read(data)
    except (AttributeError, TypeError, ValueError) as exc:
        if isinstance(exc, RecordError):
            raise
        raise RecordError(f"unexpected shape ({exc})") from None
    return [Section(**{**s.__dict__, "source": spec.path}) for s in sections]
