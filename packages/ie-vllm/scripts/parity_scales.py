"""Fill each committed parity record's eager scales: per family and point, max |eager capture|
over the layers the backend's committed capability file serves, on the prompt the sweep used.

A record's max |backend - eager| is judged relative to that scale (packages/ie-vllm/tests/test_parity_record.py,
1e-4 of max(1, scale)), and the test recomputes a few families' scales to see the record still
describes today's eager and weights. Eager only: no engine, about a minute for every family.

    uv run python packages/ie-vllm/scripts/parity_scales.py [--backend vllm|vllm-static ...]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

CAPS_DIR = ROOT / "packages/ie-core/src/ie_core/data/capabilities"
NOTES = ROOT / "docs/notes"


def fill(backend: str) -> None:
    from vllm_parity import eager_scales, served_layers

    caps = json.loads((CAPS_DIR / f"{backend}.json").read_text())
    path = NOTES / f"{backend.replace('-', '_')}_parity.json"
    record = json.loads(path.read_text())
    for family, row in sorted(record.items()):
        layers = served_layers(caps, family)
        layers = {n: ls for n, ls in layers.items() if n in row["worst_max_abs"]}
        row["eager_max_abs"] = eager_scales(family, layers)
        print(f"{backend} {family}: {len(layers)} points", file=sys.stderr, flush=True)
    path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--backend", action="append", choices=("vllm", "vllm-static"))
    for backend in parser.parse_args().backend or ["vllm", "vllm-static"]:
        fill(backend)


if __name__ == "__main__":
    main()
