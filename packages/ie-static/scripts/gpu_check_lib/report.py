"""The result as a short markdown summary: what a maintainer pastes into docs/notes/static.md."""

from __future__ import annotations

from typing import Any

from gpu_check_lib.plan import METRICS

METRIC_KEYS = {"tok/s": "tok_s", "cells/s": "cells_s", "rows/s": "rows_s"}


def _num(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 10 else f"{x:.2f}"


def column_rows(result: dict[str, Any]) -> list[str]:
    ratios = result.get("ratios_vs_vanilla", {})
    rows = []
    for key, col in result["columns"].items():
        unit = METRICS[key.split("/")[1]]
        stats = col["stats"].get(METRIC_KEYS[unit])
        if stats is None:
            rows.append(f"| {key} | {unit} | error | | | {'; '.join(col['errors'])[:120]} |")
            continue
        ratio = next((v for k, v in ratios.items() if k.startswith(key + " /")), None)
        rows.append(
            f"| {key} | {unit} | {_num(stats['median'])} | {_num(stats['min'])} - "
            f"{_num(stats['max'])} | {len(col['samples'][METRIC_KEYS[unit]])} | "
            f"{f'{ratio:.2f}x' if ratio is not None else ''} |"
        )
    return rows


def render(result: dict[str, Any]) -> str:
    env, model = result["environment"], result["model"]
    gpu, versions = env["gpu"], env["versions"]
    runners = sorted({s["model_runner"] or "unknown" for s in result.get("engine_starts", [])})
    lines = [
        f"GPU check: {gpu['name']} ({gpu['memory_gib']} GiB), driver {gpu.get('driver')}, "
        f"CUDA {gpu.get('cuda_runtime')}; vLLM {versions.get('vllm')}, torch "
        f"{versions.get('torch')}, transformers {versions.get('transformers')}; git {env['git']}",
        f"model {model['model_id']} @ {model['revision']} ({model['origin']}), {model['dtype']}; "
        f"model runner(s): {', '.join(runners)}",
    ]
    parity = result.get("parity")
    if parity:
        modes = [k for k in parity if isinstance(parity[k], dict) and "worst_rel_diff" in parity[k]]
        lines.append(
            "parity: "
            + "; ".join(
                f"{m} {'ok' if parity[m]['ok'] else 'FAIL'} (worst {parity[m]['worst_rel_diff']:.1e})"
                for m in modes
            )
        )
    lines += [
        "",
        "| column | unit | median | min - max | rounds | x vanilla |",
        "| --- | --- | --- | --- | --- | --- |",
        *column_rows(result),
    ]
    return "\n".join(lines)
