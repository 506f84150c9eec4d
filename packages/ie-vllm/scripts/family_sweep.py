"""Load every synthetic family on a vLLM backend, capture every point it serves, compare to eager.

Run (wrap in /work/bin/vllm-slot on a shared machine; vLLM logs to stdout/stderr):

    uv run python packages/ie-vllm/scripts/family_sweep.py [--backend vllm|vllm-static] [--family X ...]

Writes, merging into what is there (so a --family run updates only those families):
- packages/ie-core/src/ie_core/data/capabilities/<backend>.json: per family and point, served
  (a capture returned a finite tensor equal to eager within --tol on every layer it claims),
  writable, served layers, and the backend's own reason where not served;
- docs/notes/<backend>_parity.md and .json: worst max |vLLM - eager| per point per family, and
  whether 4 greedy tokens equal eager's.
Engines start one after another; each is an AsyncLLM whose engine core runs in its own process
(VLLM_ENABLE_V1_MULTIPROCESSING=0 does not keep it in-process), as the tests' engines do.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

TOL = 1e-4
CAPS_DIR = ROOT / "packages/ie-core/src/ie_core/data/capabilities"
NOTES = ROOT / "docs/notes"


def _load_json(path: Path, default: dict[str, Any]) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else default


def _capture(model: Any, ids: list[int], addresses: list[str]) -> tuple[dict[str, Any], str]:
    """All addresses in one request; on failure, one request per point to isolate the error."""
    from ie_core.runner import run

    try:
        return run(model.capture([ids], addresses)).to_dict(), ""
    except Exception as exc:
        first_error = f"{type(exc).__name__}: {exc}"
    out: dict[str, Any] = {}
    for address in addresses:
        try:
            out.update(run(model.capture([ids], [address])).to_dict())
        except Exception as exc:
            out[address] = exc
    return out, first_error


def _compare(
    got: Mapping[str, Any], want: Mapping[str, Any], addresses: list[str]
) -> dict[str, Any]:
    """address -> max abs diff (float), or an error string."""
    from vllm_parity import max_abs_diffs

    out: dict[str, Any] = {}
    for address in addresses:
        g = got.get(address)
        if g is None or isinstance(g, Exception):
            out[address] = f"capture failed: {g!r}" if g is not None else "capture returned nothing"
            continue
        if not bool(g.float().isfinite().any()) and g.numel():
            out[address] = "capture is not finite"
            continue
        try:
            out[address] = max_abs_diffs(got, want, [address])[address]
        except AssertionError as exc:
            out[address] = str(exc)
    return out


def _merged_capabilities(path: Path, backend: str, mine: dict[str, Any]) -> Any:
    """The committed capability file with this sweep's families replaced, written by ie-core's
    writer under the command `ie points --sweep` reproduces it with (the same claims and checks)."""
    from ie_core.capabilities import CapabilityFile, parse_capabilities
    from ie_core.tooling.capability_sweep import declared_of, sweep_command, versions

    old = _load_json(path, {"schema": 1, "backend": backend, "command": "", "models": {}})
    models = {
        **parse_capabilities(old).models,
        **parse_capabilities({**old, "models": mine}).models,
    }
    return CapabilityFile(
        backend, sweep_command(backend), versions(backend), models, declared_of(backend)
    )


def sweep_family(family: str, backend: str, tol: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """(capability entry, parity entry) of one family on `backend`."""
    from ie_core import SamplingParams, load_model
    from ie_core.runner import run
    from ie_core.tooling.capability_sweep import check_claims, load_kwargs
    from vllm_parity import (
        ENGINE_DIFFERENCES,
        PROMPT_TEXT,
        align_eager,
        eager_scales,
        servable_addresses,
    )

    model_id = f"ie-synthetic/{family}"
    t0 = time.time()
    eager = load_model(model_id, backend="eager", device="cpu", dtype="float32")
    ids = eager.to_tokens(PROMPT_TEXT)
    align_eager(family, eager)
    # vllm-static declares every tappable point at every layer ("all"), so its answer is what the
    # backend can tap; hooked vLLM serves any point per request.
    model = load_model(model_id, backend=backend, **load_kwargs(backend))
    try:
        caps = model.capabilities()
        # The claims' refusals (reason text) and writability, checked by capture and steer.
        mismatches = {m.address: m.problem for m in check_claims(model, caps)}
        tapped = set(getattr(model, "reads", ()))  # vllm-static: the sites it installed
        addresses = [a for a in servable_addresses(model) if not tapped or a in tapped]
        got, error = _capture(model, ids, addresses)
        want = run(eager.capture([ids], addresses))
        diffs = _compare(got, want, addresses)
        params = SamplingParams(max_new_tokens=4, stop_at_eos=False)
        prompt = eager.to_tokens("def add(a, b):")
        greedy = (
            run(model.generate(prompt, params)).token_ids
            == run(eager.generate(prompt, params)).token_ids
        )
    finally:
        run(model.shutdown())
    points: dict[str, Any] = {}
    worst: dict[str, Any] = {}
    for name, cap in caps.items():
        entry = cap.to_json()
        mine = {a: d for a, d in diffs.items() if a.partition(".")[0] == name}
        bad = {a: d for a, d in mine.items() if isinstance(d, str) or not d <= tol}
        bad |= {
            a: f"claim check: {p}" for a, p in mismatches.items() if a.partition(".")[0] == name
        }
        if mine:
            numeric = [d for d in mine.values() if not isinstance(d, str)]
            worst[name] = max(numeric) if len(numeric) == len(mine) else "error"
        if cap.served and bad:
            address, d = sorted(bad.items())[0]
            what = d if isinstance(d, str) else f"differs from eager by {d:.3g} (tol {tol:g})"
            entry.update(served=False, writable=False, layers=[])
            entry["reason"] = f"sweep: {address} {what}"
        points[name] = entry
    cap_entry = {"family": family, "points": points}
    served = {n: p["layers"] or [None] for n, p in points.items() if p["served"] and n in worst}
    parity = {
        "worst_max_abs": worst,
        "eager_max_abs": eager_scales(family, served),  # test_parity_record.py judges by it
        "greedy_tokens_equal": greedy,
        "served": sum(p["served"] for p in points.values()),
        "refused": sum(not p["served"] for p in points.values()),
        "seconds_under_load": round(time.time() - t0, 1),
        "capture_error": error,
        "claim_mismatches": mismatches,
        "eager_aligned": ENGINE_DIFFERENCES.get(family, ""),
    }
    return cap_entry, parity


def _render_md(backend: str, parity: dict[str, Any], command: str) -> str:
    names = sorted({p for e in parity.values() for p in e["worst_max_abs"]})
    fams = sorted(parity)
    lines = [
        f"# {backend}: parity against eager on the synthetic families",
        "",
        f"Generated by `{command}` (fp32, CPU). Each cell is the worst max |{backend} - eager| over",
        "layers for one capture of `vllm_parity.PROMPT_TEXT` (41 tokens); blank = not served on that family.",
        "Timings include engine start and were taken under load on a shared 2-core machine.",
        "",
        "| family | served | refused | greedy = eager | seconds (under load) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for f in fams:
        e = parity[f]
        lines.append(
            f"| {f} | {e['served']} | {e['refused']} | {'yes' if e['greedy_tokens_equal'] else 'NO'}"
            f" | {e['seconds_under_load']} |"
        )
    notes = [f"- {f}: {parity[f]['eager_aligned']}" for f in fams if parity[f].get("eager_aligned")]
    if notes:
        lines += ["", "Where vLLM's model math differs from HF's by design:", "", *notes]
    lines += ["", "| point | " + " | ".join(fams) + " |", "| --- |" + " --- |" * len(fams)]
    for n in names:
        cells = []
        for f in fams:
            d = parity[f]["worst_max_abs"].get(n)
            cells.append("" if d is None else d if isinstance(d, str) else f"{d:.1e}")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    from ie_eager.synthetic import FAMILIES

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--backend", default="vllm", choices=("vllm", "vllm-static"))
    parser.add_argument("--family", action="append", help="family slug (repeatable; default all)")
    parser.add_argument("--tol", type=float, default=TOL)
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "1800")
    families = args.family or list(FAMILIES)
    command = "uv run python packages/ie-vllm/scripts/family_sweep.py --backend " + args.backend
    caps_path = CAPS_DIR / f"{args.backend}.json"
    parity_path = NOTES / f"{args.backend.replace('-', '_')}_parity.json"
    CAPS_DIR.mkdir(parents=True, exist_ok=True)
    mine_caps: dict[str, Any] = {}
    mine_parity: dict[str, Any] = {}
    t_all = time.time()
    for family in families:
        try:
            entry, row = sweep_family(family, args.backend, args.tol)
        except Exception as exc:  # one family's failure is a line, not a crash
            print(f"{family}: FAILED {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            continue
        mine_caps[f"ie-synthetic/{family}"] = entry
        mine_parity[family] = row
        # Re-read before each write, so sweeps of other families running beside this one keep
        # their entries.
        caps_path.write_text(_merged_capabilities(caps_path, args.backend, mine_caps).dumps())
        parity = {**_load_json(parity_path, {}), **mine_parity}
        parity_path.write_text(json.dumps(parity, indent=1, sort_keys=True) + "\n")
        parity_path.with_suffix(".md").write_text(_render_md(args.backend, parity, command))
        worst = [v for v in row["worst_max_abs"].values() if not isinstance(v, str)]
        print(
            f"{family}: served {row['served']} refused {row['refused']} greedy "
            f"{row['greedy_tokens_equal']} worst {max(worst, default=math.nan):.2e} "
            f"{row['seconds_under_load']}s",
            file=sys.stderr,
            flush=True,
        )
    print(f"sweep wall time {time.time() - t_all:.0f}s (under load)", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
