"""Markdown from results and tables: the matrix in validator/README.md (between markers), one
page per model under validator/models/, and docs/ENGINE_HOOK_MAPPINGS.md."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from ie_core.grammar import FAMILIES, POINTS

from ie_validator.engines.registry import ALL
from ie_validator.explanations import explain
from ie_validator.mappings import ENGINE_TABLES, Gap, Hook, lookup
from ie_validator.results import load_results, model_slug
from ie_validator.scoring import Tier, gate

BEGIN, END = "<!-- validator-matrix:begin -->", "<!-- validator-matrix:end -->"
GLYPHS = {"pass": "✅", "warn": "⚠️", "fail": "❌", "unsupported": "➖", "not run": "·"}
LEGEND = "✅ pass · ⚠️ warn · ❌ fail · ➖ unsupported (engine cannot run the model) · `·` not run"


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _cell(result: dict[str, Any] | None) -> str:
    if result is None:
        return GLYPHS["not run"]
    s = result["summary"]
    glyph = GLYPHS[result["verdict"]]
    if result["status"] != "ok":
        return f"{glyph} {result['status'].replace('_', ' ')}"
    compared = s["pass"] + s["warn"] + s["fail"]
    parts = [f"{glyph} {s['pass']}/{compared}"]
    if s["warn"]:
        parts.append(f"{s['warn']} warn")
    if s["fail"]:
        parts.append(f"{s['fail']} fail")
    if s["n/a"]:
        parts.append(f"{s['n/a']} n/a")
    worst = _worst(result)
    if worst:
        parts.append(worst)
    return " · ".join(parts)


def _worst(result: dict[str, Any]) -> str:
    """The measured worst of the compared points: `bit-exact` only where every max abs diff is
    0.0, else the largest relative error (what the gate reads)."""
    scored = [p for p in result["points"] if p["max_abs_diff"] is not None]
    if not scored:
        return ""
    if all(p["max_abs_diff"] == 0.0 for p in scored):
        return "bit-exact"
    return f"rel ≤ {max(p['rel_diff'] for p in scored):.1e}"


def _by_model(results: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    table: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for r in results:
        table[r["hf_id"]][r["engine"]] = r
    return dict(sorted(table.items()))


def _non_pass(result: dict[str, Any]) -> list[str]:
    """One line per non-pass point name: its layers, status and worst figures (or its reason)."""
    if result["status"] != "ok":
        return [result["error"].splitlines()[0][:300] if result["error"] else result["status"]]
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for p in result["points"]:
        if p["status"] in ("warn", "fail"):
            groups[p["point"]].append(p)
    lines = []
    for point, rows in groups.items():
        layers = ",".join(str(r["layer"]) for r in rows if r["layer"] is not None)
        where = f"`{point}.{{{layers}}}`" if layers else f"`{point}`"
        statuses = "/".join(sorted({r["status"] for r in rows}))
        cos = [r["cos"] for r in rows if r["cos"] is not None]
        diff = [r["max_abs_diff"] for r in rows if r["max_abs_diff"] is not None]
        rel = [r["rel_diff"] for r in rows if r["rel_diff"] is not None]
        if cos:
            lines.append(
                f"{where} {statuses}: max rel {max(rel):.3g}, min cos {min(cos):.6f}, "
                f"max abs diff {max(diff):.3g}"
            )
        else:
            lines.append(f"{where} {statuses}: {rows[0]['reason'][:200]}")
    return lines


def render_matrix(results: list[dict[str, Any]]) -> str:
    by_model = _by_model(results)
    engines = [e for e in ALL if any(e in cells for cells in by_model.values())] or list(ALL)
    engines += [e for e in ALL if e not in engines]
    lines = [
        LEGEND + ". A cell reads `passed/compared`, then the measured worst: `bit-exact` "
        "(every compared point's max abs diff is 0.0) or `rel ≤ x`, the largest relative "
        "error |a - b|₂ / |ref|₂ of its points; n/a points are declared gaps (drill down on "
        "the model page for each reason).",
        "",
        "| model | " + " | ".join(engines) + " |",
        "| --- | " + " | ".join("---" for _ in engines) + " |",
    ]
    for hf_id, cells in by_model.items():
        link = f"[{hf_id}](models/{model_slug(hf_id)}.md)"
        lines.append(f"| {link} | " + " | ".join(_cell(cells.get(e)) for e in engines) + " |")
    notes = []
    for hf_id, cells in by_model.items():
        for engine in engines:
            r = cells.get(engine)
            if r is None or r["verdict"] == "pass":
                continue
            why = explain(engine, r["family"], r)
            detail = "; ".join(_non_pass(r)) or "no point compared"
            notes.append(
                f"- **{hf_id} / {engine}** ({r['verdict']}): {why or 'UNEXPLAINED'}  \n  {detail}"
            )
    if notes:
        lines += ["", "Non-pass cells:", "", *notes]
    when = max((r["captured_at"] for r in results), default="never")
    refs = sorted({r["reference"] for r in results})
    lines += ["", f"Reference: {', '.join(refs) or '-'}. Latest capture: {when}."]
    return "\n".join(lines)


def _quantized_note(r: dict[str, Any]) -> str:
    """On a quantized checkpoint: the engine's dtype and the scheme's own gate."""
    scheme = r.get("quantization", "")
    if not scheme:
        return ""
    limit = gate(r["dtype"], Tier(r["tier"]), scheme)
    return (
        f" Quantized `{scheme}`, computed in {r['dtype']}: gated at rel <= {limit:g}, this "
        'scheme\'s measured gate (validator README, "Quantized checkpoints").'
    )


def render_model_page(hf_id: str, cells: dict[str, dict[str, Any]]) -> str:
    any_result = next(iter(cells.values()))
    lines = [
        f"# {hf_id}",
        "",
        "<!-- Generated by `ie validate render`. Do not edit by hand. -->",
        "",
        f"Family `{any_result['family']}` (`{any_result['architecture']}`), reference "
        f"`{any_result['reference']}`, {any_result['dtype']} on {any_result['device']}, layers "
        f"{any_result['layers']}, prompt {any_result['prompt']!r} ({len(any_result['token_ids'])} tokens).",
        "",
    ]
    for engine in [e for e in ALL if e in cells]:
        r = cells[engine]
        lines += [
            f"## {engine}: {GLYPHS[r['verdict']]} {r['verdict']}",
            "",
            f"Tier `{r['tier']}`, status `{r['status']}`, captured {r['captured_at']}."
            + _quantized_note(r),
        ]
        if r["error"]:
            lines += ["", "```", r["error"][:2000], "```"]
        if r["points"]:
            lines += [
                "",
                "| address | status | cos | max abs | rel | worst token (max abs, cos) | engine name | reason |",
                "| --- | --- | --- | --- | --- | --- | --- | --- |",
            ]
            for p in r["points"]:
                worst = (
                    "-"
                    if p["worst_token"] is None
                    else f"{p['worst_token']} ({_fmt(p['worst_token_max_abs_diff'], '.2e')}, "
                    f"{_fmt(p['worst_token_cos'], '.6f')})"
                )
                hook = f"`{p['engine_hook']}`" if p["engine_hook"] else "-"
                lines.append(
                    f"| `{p['address']}` | {p['status']} | {_fmt(p['cos'], '.7f')} | "
                    f"{_fmt(p['max_abs_diff'], '.2e')} | {_fmt(p['rel_diff'], '.2e')} | {worst} | "
                    f"{hook} | {p['reason'].replace('|', '/')} |"
                )
        lines.append("")
    return "\n".join(lines)


def replace_between_markers(text: str, body: str) -> str:
    if BEGIN not in text or END not in text:
        raise ValueError(f"README lacks the markers {BEGIN} / {END}")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{body}\n{END}{tail}"


def render_all(
    results_root: Path,
    validator_dir: Path,
    readme: Path | None = None,
    pages: Path | None = None,
) -> None:
    """Rewrite the README matrix block and every model page from the result files.

    `readme` (default `validator_dir/README.md`) is created with the markers when missing, so a
    results folder outside a clone renders into a fresh `validation.md`."""
    results = load_results(results_root)
    readme = readme or validator_dir / "README.md"
    if not readme.exists():
        readme.write_text(f"# Validation\n\n{BEGIN}\n{END}\n")
    readme.write_text(replace_between_markers(readme.read_text(), render_matrix(results)))
    pages = pages or validator_dir / "models"
    pages.mkdir(exist_ok=True)
    for hf_id, cells in _by_model(results).items():
        (pages / f"{model_slug(hf_id)}.md").write_text(render_model_page(hf_id, cells))


def _entry_cell(entry: Hook | Gap) -> str:
    if isinstance(entry, Gap):
        return f"n/a: {entry.reason}"
    return f"`{entry.name}`" + (f" (layout `{entry.layout}`, transposed)" if entry.layout else "")


def render_mappings() -> str:
    """docs/ENGINE_HOOK_MAPPINGS.md from the tables in `ie_validator.mappings`."""
    lines = [
        "# Engine hook mappings",
        "",
        "<!-- Generated by `ie validate mappings --write`. Do not edit by hand. -->",
        "",
        "How the validator asks each engine for a canonical point. `{L}` is the layer. "
        "The source of truth is `validator/src/ie_validator/mappings.py`; a declared gap (n/a) "
        "becomes an N/A row with that reason in the results. nnsight accessors are module paths "
        "with `.input` (first positional argument, else `hidden_states`) or `.output[i]`.",
        "",
        "## Default tables (Llama-style module names)",
        "",
        "`vllm` and `vllm-static` take the canonical address itself; which points they serve (and "
        "why not the rest) is in [SUPPORTED_POINTS.md](SUPPORTED_POINTS.md), and a refusal there "
        "becomes an n/a row here.",
        "",
        "| point | TransformerLens | nnsight | nnterp |",
        "| --- | --- | --- | --- |",
    ]
    for p in POINTS:
        if p.requires in {"multi_stream", "gated_attention"}:
            continue
        cells = [_entry_cell(lookup(e, "default", p.name)) for e in ENGINE_TABLES]
        lines.append(f"| `{p.name}` | " + " | ".join(cells) + " |")
    lines += ["", "## Per-family differences from the default", ""]
    families = sorted({f for t in ENGINE_TABLES.values() for f in t if f != "default"})
    known = {f.slug: f.name for f in FAMILIES}
    for family in families:
        lines += [
            f"### {known.get(family, family)} (`{family}`)",
            "",
            "| point | engine | name |",
            "| --- | --- | --- |",
        ]
        for engine, tables in ENGINE_TABLES.items():
            if family not in tables:
                continue
            for p in POINTS:
                entry = lookup(engine, family, p.name)
                if entry != lookup(engine, "default", p.name):
                    lines.append(f"| `{p.name}` | {engine} | {_entry_cell(entry)} |")
        lines.append("")
    return "\n".join(lines)
